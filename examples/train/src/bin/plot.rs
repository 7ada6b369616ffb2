//! `plot`: one PNG of one or more `train --metrics` files (training and
//! evaluation loss, learning rate, tokens/s against the step; several runs
//! overlaid, named by their files' stems).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use trainer::error_line::print_error;
use trainer::plot::{beside, plot_files};

#[derive(Parser, Debug)]
#[command(version, about = "Plot train --metrics files into one PNG")]
struct Cli {
    /// Metrics files (JSON lines) written by `train --metrics`.
    #[arg(required = true, value_name = "METRICS")]
    metrics: Vec<PathBuf>,
    /// The PNG to write (default: beside the one metrics file, its stem
    /// with `.png`; needed with several files).
    #[arg(short = 'o', long = "out", value_name = "OUT.png")]
    out: Option<PathBuf>,
    /// A TrueType font for the text (default: DejaVu Sans where the usual
    /// Linux distributions install it).
    #[arg(long, value_name = "FILE.ttf")]
    font: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = match (&cli.out, &cli.metrics[..]) {
        (Some(out), _) => out.clone(),
        (None, [one]) => beside(one),
        (None, _) => {
            eprintln!("error: -o OUT.png is needed to plot several metrics files into one");
            return ExitCode::FAILURE;
        }
    };
    match plot_files(&cli.metrics, &out, cli.font.as_deref()) {
        Ok(()) => {
            println!("plot: {}", out.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            print_error("", &err);
            ExitCode::FAILURE
        }
    }
}
