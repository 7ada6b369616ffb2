//! Developer commands: `cargo xtask <command>` (alias in `.cargo/config.toml`).

use anyhow::{bail, Result};

const USAGE: &str =
    "usage: cargo xtask <command>\n\ncommands:\n  ci      run what CI runs (.ci/run)";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => {
            let status = std::process::Command::new("bash").arg(".ci/run").status()?;
            if !status.success() {
                bail!(".ci/run failed ({status})");
            }
            Ok(())
        }
        Some(other) => bail!("unknown xtask command `{other}`\n\n{USAGE}"),
        None => {
            println!("{USAGE}");
            Ok(())
        }
    }
}
