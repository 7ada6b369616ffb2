//! `cargo xtask bench cuda run`: the GPU rows on the machine xtask runs on,
//! in one go: build `train`, run the selected rows through
//! `bench/gpu/pipeline.sh`'s `bench` part (the row code the device flow
//! runs), then write the report with the same code as `bench cuda report`.
//!
//! What would otherwise fail after a long build is checked before it: the
//! names asked for, `nvidia-smi`, the tools the row runner needs, the plot's
//! font, and whether python3's torch can run the PyTorch peers.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::SYSTEMS;

/// The package with the `train` binary. `bench/gpu/binaries.sh` defaults to
/// the same name (a test keeps them equal).
pub const TRAIN_PACKAGE: &str = "trainer";

/// The shapes `pipeline.sh`'s `bench_rows` knows, as named in row files, with
/// the spellings accepted for each.
const SHAPES: [(&str, &[&str]); 3] = [
    ("085b", &["085b", "0.85b"]),
    ("3b", &["3b"]),
    ("7b", &["7b"]),
];

/// pipeline.sh's knobs that `run` passes through from the environment; they
/// change the rows, so the report's command line quotes them.
const PIPELINE_KNOBS: [&str; 12] = [
    "LIMIT_ROW",
    "LIMIT_PEER",
    "BENCH_STEPS",
    "RESIDENT_BATCH",
    "MATMUL",
    "TAG",
    "ARGS",
    "TRACE",
    "SAMPLE",
    "CUBLAS_DIR",
    "BENCH_OLD",
    "HOST_GIB",
];

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Model shapes: 085b (0.85B Llama, also spelled 0.85b), 3b, 7b
    /// (Llama-2-7B; HOST_GIB passes the host's RAM to the planner). Repeat
    /// or comma-separate.
    #[arg(long = "shape", alias = "shapes", value_delimiter = ',', default_values = ["085b"])]
    shapes: Vec<String>,
    /// Thousands of tokens per optimizer step (1024-token sequences), e.g.
    /// 4,16,64.
    #[arg(long, value_delimiter = ',', default_values = ["4", "16"])]
    tokens: Vec<String>,
    /// Systems: resident, pipelined, serial, torch-resident, torch-ckpt,
    /// torch-fsdp2; `torch` names the three PyTorch peers; for models that
    /// fill the host, compact, compact8 (8-bit Adam state) and fused;
    /// megatrain, MegaTrain's own engine (its package in .device/megatrain:
    /// bench/peers/megatrain_fetch.sh).
    #[arg(
        long,
        alias = "system",
        value_delimiter = ',',
        default_values = ["resident", "pipelined", "serial", "torch"]
    )]
    systems: Vec<String>,
    /// Compute precisions: fp32, bf16 (bf16 compute over fp32 master weights).
    #[arg(long, value_delimiter = ',', default_values = ["fp32"])]
    precision: Vec<String>,
    /// Results folder: the rows' files in `rows/`, the report beside them.
    /// An existing folder gets the new rows added, and the report covers all
    /// of them. Default: a new bench/results/local-<date>.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Reuse the train binary already built instead of building it.
    #[arg(long)]
    no_build: bool,
    /// A TrueType font for the plot's text.
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
}

/// The rows asked for, checked: every shape at every tokens/step with every
/// system at every precision, in pipeline.sh's order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Selection {
    shapes: Vec<&'static str>,
    /// Thousands of tokens per step.
    tokens: Vec<u32>,
    /// Base systems, from [`SYSTEMS`].
    systems: Vec<&'static str>,
    bf16: Vec<bool>,
}

/// Each item once, in first-seen order.
fn dedup<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn names(items: &[&str]) -> String {
    items.join(", ")
}

impl Selection {
    fn parse(args: &RunArgs) -> Result<Self> {
        let shapes = args
            .shapes
            .iter()
            .map(|s| {
                let s = s.trim();
                SHAPES
                    .iter()
                    .find(|(_, spellings)| spellings.contains(&s.to_lowercase().as_str()))
                    .map(|(name, _)| *name)
                    .with_context(|| {
                        let known: Vec<&str> = SHAPES.iter().map(|(n, _)| *n).collect();
                        format!("unknown shape `{s}` (known: {})", names(&known))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let tokens = args
            .tokens
            .iter()
            .map(|t| {
                let t = t.trim();
                // `16k` reads as well as `16`: the unit is thousands anyway.
                let digits = t.strip_suffix(['k', 'K']).unwrap_or(t);
                match digits.parse::<u32>() {
                    Ok(k) if k > 0 => Ok(k),
                    _ => bail!(
                        "bad --tokens value `{t}` (thousands of tokens per step, a positive whole number)"
                    ),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let mut systems = Vec::new();
        for s in &args.systems {
            let s = s.trim();
            if s == "torch" {
                systems.extend(SYSTEMS.iter().filter(|x| x.starts_with("torch-")));
            } else if let Some(known) = SYSTEMS.iter().find(|x| **x == s) {
                systems.push(*known);
            } else {
                bail!(
                    "unknown system `{s}` (known: {}, torch; bf16 rows: --precision bf16)",
                    names(&SYSTEMS)
                );
            }
        }
        let bf16 = args
            .precision
            .iter()
            .map(|p| match p.trim() {
                "fp32" => Ok(false),
                "bf16" => Ok(true),
                other => bail!("unknown precision `{other}` (known: fp32, bf16)"),
            })
            .collect::<Result<Vec<_>>>()?;
        let selection = Selection {
            shapes: dedup(shapes),
            tokens: dedup(tokens),
            systems: dedup(systems),
            bf16: dedup(bf16),
        };
        if selection.shapes.is_empty()
            || selection.tokens.is_empty()
            || selection.systems.is_empty()
            || selection.bf16.is_empty()
        {
            bail!(
                "no rows selected (--shape, --tokens, --systems and --precision each need a value)"
            );
        }
        Ok(selection)
    }

    fn has_torch(&self) -> bool {
        self.systems.iter().any(|s| s.starts_with("torch-"))
    }

    fn without_torch(&self) -> Self {
        Selection {
            systems: self
                .systems
                .iter()
                .copied()
                .filter(|s| !s.starts_with("torch-"))
                .collect(),
            ..self.clone()
        }
    }

    /// The systems as row names spell them: fp32 first, then `-bf16`.
    fn system_names(&self) -> Vec<String> {
        self.bf16
            .iter()
            .flat_map(|&bf16| {
                self.systems
                    .iter()
                    .map(move |s| format!("{s}{}", if bf16 { "-bf16" } else { "" }))
            })
            .collect()
    }

    /// What pipeline.sh's `bench` part reads to run exactly these rows.
    fn env(&self) -> Vec<(&'static str, String)> {
        let tokens: Vec<String> = self.tokens.iter().map(u32::to_string).collect();
        vec![
            ("SHAPES", self.shapes.join(" ")),
            ("BENCH_TOKENS", tokens.join(" ")),
            ("SYSTEMS", self.system_names().join(" ")),
        ]
    }

    /// The rows' file stems, in the order pipeline.sh runs them.
    fn rows(&self) -> Vec<String> {
        let systems = self.system_names();
        let mut rows = Vec::new();
        for shape in &self.shapes {
            for k in &self.tokens {
                for system in &systems {
                    rows.push(format!("bench-{shape}-{k}k-{system}"));
                }
            }
        }
        rows
    }
}

/// Whether python3's torch can run the PyTorch peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Torch {
    Ready,
    Missing,
    NoCuda,
}

impl Torch {
    fn probe() -> Self {
        let status = Command::new("python3")
            .args([
                "-c",
                "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match status.map(|s| s.code()) {
            Ok(Some(0)) => Torch::Ready,
            Ok(Some(3)) => Torch::NoCuda,
            _ => Torch::Missing,
        }
    }

    /// Why the PyTorch peer rows were left out, for the terminal and the
    /// markdown; None when they run.
    fn skip_note(self) -> Option<&'static str> {
        match self {
            Torch::Ready => None,
            Torch::Missing => Some("PyTorch peer rows skipped: python3 has no torch"),
            Torch::NoCuda => Some("PyTorch peer rows skipped: python3's torch sees no CUDA GPU"),
        }
    }
}

/// The selection that will run, and the note when the peers were dropped.
fn with_torch(selection: &Selection, torch: Torch) -> Result<(Selection, Option<&'static str>)> {
    if !selection.has_torch() {
        return Ok((selection.clone(), None));
    }
    let Some(note) = torch.skip_note() else {
        return Ok((selection.clone(), None));
    };
    let rest = selection.without_torch();
    if rest.systems.is_empty() {
        bail!("{note}, and only PyTorch peer rows were asked for");
    }
    Ok((rest, Some(note)))
}

/// Paths pipeline.sh splices into commands unquoted must have no whitespace.
fn plain_path(path: &Path, what: &str) -> Result<()> {
    if path.to_string_lossy().chars().any(char::is_whitespace) {
        bail!(
            "{what} `{}` has whitespace, which bench/gpu/pipeline.sh cannot take",
            path.display()
        );
    }
    Ok(())
}

/// `nvidia-smi`'s presence, before anything is built: without it there is
/// no GPU to run the rows on, and pipeline.sh polls memory through it.
fn check_gpu() -> Result<()> {
    match Command::new("nvidia-smi")
        .arg("-L")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "nvidia-smi not found: `bench cuda run` needs an NVIDIA GPU on this machine \
             (for a remote one: `bench cuda build`)"
        ),
        Err(e) => bail!("cannot run nvidia-smi: {e}"),
        Ok(s) if !s.success() => bail!("nvidia-smi -L failed ({s}): no usable NVIDIA GPU"),
        Ok(_) => Ok(()),
    }
}

/// The row runner's own tools: python3 summarises every row, GNU time
/// measures the host peak.
fn check_tools() -> Result<()> {
    let python = Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !python.is_ok_and(|s| s.success()) {
        bail!("python3 not found: bench/gpu/pipeline.sh summarises each row with it");
    }
    if !Path::new("/usr/bin/time").exists() {
        bail!("/usr/bin/time not found (GNU time): bench/gpu/pipeline.sh measures the host peak with it");
    }
    Ok(())
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian
/// (H. Hinnant's civil_from_days).
fn civil_date(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `bench/results/local-<UTC date>`, with `-2`, `-3`… when a run of the
/// same day is there already (a default must not mix in older rows).
fn default_out(root: &Path) -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_date((secs / 86_400) as i64);
    let base = root.join(format!("bench/results/local-{y:04}-{m:02}-{d:02}"));
    let mut out = base.clone();
    let mut n = 2;
    while out.exists() {
        out = PathBuf::from(format!("{}-{n}", base.display()));
        n += 1;
    }
    out
}

/// The command line for the report: pipeline.sh knobs set in the
/// environment first, as a shell would take them.
fn command_line(knobs: &[(String, String)], args: &[String]) -> String {
    let mut parts: Vec<String> = knobs
        .iter()
        .map(|(k, v)| {
            if v.contains(char::is_whitespace) {
                format!("{k}=\"{v}\"")
            } else {
                format!("{k}={v}")
            }
        })
        .collect();
    parts.push("cargo xtask".into());
    parts.extend(args.iter().cloned());
    parts.join(" ")
}

/// The repository root, where pipeline.sh and the build run: the current
/// folder where it is one (an xtask binary carried to a GPU machine runs
/// from a copy of the tree elsewhere), else the one xtask was built in.
fn repository_root() -> Result<PathBuf> {
    let here = std::env::current_dir().context("cannot read the current folder")?;
    if here.join("bench/gpu/pipeline.sh").is_file() {
        return Ok(here);
    }
    Ok(Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask has no parent folder")?
        .to_path_buf())
}

pub fn run(args: &RunArgs) -> Result<()> {
    // Names first: a typo must not cost a build.
    let asked = Selection::parse(args)?;
    let root = repository_root()?;
    let out = match &args.out {
        Some(out) => std::env::current_dir()?.join(out),
        None => default_out(&root),
    };
    plain_path(&out, "--out")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| root.join(t))
        .unwrap_or_else(|| root.join("target"));
    let train = target.join("release/train");
    plain_path(&train, "the train binary")?;
    fs::metadata(&args.font).with_context(|| {
        format!(
            "cannot read the plot font `{}` (pass --font with a TrueType file)",
            args.font.display()
        )
    })?;
    check_gpu()?;
    check_tools()?;
    let torch = if asked.has_torch() {
        Torch::probe()
    } else {
        Torch::Ready
    };
    let (selection, note) = with_torch(&asked, torch)?;
    if let Some(note) = note {
        println!("{note}");
    }
    if args.no_build {
        if !train.exists() {
            bail!(
                "--no-build: no train binary at `{}` (build it: drop --no-build)",
                train.display()
            );
        }
    } else {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(&cargo)
            .args(["build", "--release", "--features", "cuda", "-p"])
            .args([TRAIN_PACKAGE, "--bin", "train"])
            .current_dir(&root)
            .status()
            .with_context(|| format!("cannot run `{cargo}`"))?;
        if !status.success() {
            bail!("building train with CUDA failed ({status})");
        }
    }

    let rows_dir = out.join("rows");
    fs::create_dir_all(&rows_dir)
        .with_context(|| format!("cannot create `{}`", rows_dir.display()))?;
    let rows = selection.rows();
    println!(
        "{} rows ({}) → {}",
        rows.len(),
        rows.join(", "),
        rows_dir.display()
    );
    let status = Command::new("bash")
        .args(["bench/gpu/pipeline.sh", "bench"])
        .envs(selection.env())
        .env("TRAIN_BIN", &train)
        .env("WORK", &rows_dir)
        .env("OUT", &out)
        .current_dir(&root)
        .status()
        .context("cannot run bench/gpu/pipeline.sh")?;
    if !status.success() {
        bail!(
            "bench/gpu/pipeline.sh failed ({status}); its rows so far are in `{}`",
            rows_dir.display()
        );
    }

    let knobs: Vec<(String, String)> = PIPELINE_KNOBS
        .iter()
        .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
        .collect();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let notes: Vec<String> = note.map(String::from).into_iter().collect();
    super::write_report(
        &rows_dir,
        &out,
        &command_line(&knobs, &argv),
        &notes,
        &args.font,
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(argv: &[&str]) -> Result<Selection> {
        let cli = Cli::try_parse_from(std::iter::once("run").chain(argv.iter().copied()))?;
        Selection::parse(&cli.run)
    }

    fn error(argv: &[&str]) -> String {
        parse(argv).unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_every_fp32_system_on_the_small_shape() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.shapes, ["085b"]);
        assert_eq!(s.tokens, [4, 16]);
        assert_eq!(s.systems, SYSTEMS[..6]);
        assert_eq!(s.bf16, [false]);
        assert_eq!(s.rows().len(), 12);
    }

    #[test]
    fn flags_map_to_pipeline_env_and_rows() {
        let s = parse(&[
            "--shape",
            "0.85b",
            "--shape",
            "3b,085b",
            "--tokens",
            "16k,64",
            "--systems",
            "pipelined,serial",
            "--systems",
            "torch-fsdp2,pipelined",
            "--precision",
            "fp32,bf16",
        ])
        .unwrap();
        assert_eq!(
            s.env(),
            [
                ("SHAPES", "085b 3b".to_string()),
                ("BENCH_TOKENS", "16 64".to_string()),
                (
                    "SYSTEMS",
                    "pipelined serial torch-fsdp2 pipelined-bf16 serial-bf16 torch-fsdp2-bf16"
                        .to_string()
                ),
            ]
        );
        let rows = s.rows();
        assert_eq!(rows.len(), 2 * 2 * 6);
        assert_eq!(rows[0], "bench-085b-16k-pipelined");
        assert_eq!(rows[5], "bench-085b-16k-torch-fsdp2-bf16");
        assert_eq!(rows[23], "bench-3b-64k-torch-fsdp2-bf16");
        // The report reads back the same shape, tokens and system.
        for row in &rows {
            let (shape, tokens, system) = super::super::rows::parse_name(row).unwrap();
            assert!(s.shapes.contains(&shape.as_str()));
            assert!(s.tokens.contains(&((tokens / 1024) as u32)));
            assert!(s.system_names().contains(&system));
        }
    }

    #[test]
    fn torch_names_the_three_peers() {
        let s = parse(&["--systems", "torch"]).unwrap();
        assert_eq!(s.systems, ["torch-resident", "torch-ckpt", "torch-fsdp2"]);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        assert_eq!(
            error(&["--shape", "13b"]),
            "unknown shape `13b` (known: 085b, 3b, 7b)"
        );
        let e = error(&["--systems", "pipelined,fsdp"]);
        assert!(
            e.starts_with("unknown system `fsdp` (known: resident,"),
            "{e}"
        );
        assert!(error(&["--systems", "pipelined-bf16"]).contains("--precision bf16"));
        assert_eq!(
            error(&["--precision", "fp16"]),
            "unknown precision `fp16` (known: fp32, bf16)"
        );
        for bad in ["0", "-4", "four", "4.5"] {
            let e = error(&[&format!("--tokens={bad}")]);
            assert!(e.starts_with(&format!("bad --tokens value `{bad}`")), "{e}");
        }
        for e in [
            error(&["--shape", "13b"]),
            error(&["--systems", "x"]),
            error(&["--tokens", "x"]),
        ] {
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn peers_without_torch_are_left_out_with_a_note() {
        let s = parse(&[]).unwrap();
        let (ran, note) = with_torch(&s, Torch::Ready).unwrap();
        assert_eq!((ran, note), (s.clone(), None));
        let (ran, note) = with_torch(&s, Torch::Missing).unwrap();
        assert_eq!(ran.systems, ["resident", "pipelined", "serial"]);
        assert_eq!(
            note,
            Some("PyTorch peer rows skipped: python3 has no torch")
        );
        let only = parse(&["--systems", "torch-ckpt"]).unwrap();
        let e = with_torch(&only, Torch::NoCuda).unwrap_err().to_string();
        assert!(e.contains("only PyTorch peer rows were asked for"), "{e}");
        // No peers asked for: nothing to say about torch.
        let ours = parse(&["--systems", "pipelined"]).unwrap();
        assert_eq!(with_torch(&ours, Torch::Missing).unwrap().1, None);
    }

    #[test]
    fn names_match_the_scripts() {
        // The shape and system names are pipeline.sh's; the package is
        // binaries.sh's default.
        let pipeline = include_str!("../../../bench/gpu/pipeline.sh");
        for (shape, _) in SHAPES {
            assert!(pipeline.contains(&format!("  {shape}) cfg=")), "{shape}");
        }
        for system in SYSTEMS {
            let case = match system.strip_prefix("torch-") {
                Some(_) => "  torch-*)".to_string(),
                None => format!("  {system})"),
            };
            assert!(pipeline.contains(&case), "{system}");
        }
        let binaries = include_str!("../../../bench/gpu/binaries.sh");
        assert!(binaries.contains(&format!("${{TRAIN_PACKAGE:-{TRAIN_PACKAGE}}}")));
    }

    #[test]
    fn paths_and_dates() {
        assert!(plain_path(Path::new("/a b/out"), "--out").is_err());
        assert!(plain_path(Path::new("/a/out"), "--out").is_ok());
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(19_782), (2024, 2, 29));
        assert_eq!(civil_date(20_454), (2026, 1, 1));
        let knobs = [
            ("LIMIT_ROW".to_string(), "200".to_string()),
            ("ARGS".to_string(), "--fused --no-guard".to_string()),
        ];
        let argv = ["bench", "cuda", "run", "--tokens", "64"].map(String::from);
        assert_eq!(
            command_line(&knobs, &argv),
            "LIMIT_ROW=200 ARGS=\"--fused --no-guard\" cargo xtask bench cuda run --tokens 64"
        );
    }
}
