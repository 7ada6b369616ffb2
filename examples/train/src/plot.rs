//! One PNG of one or more `--metrics` files: panels of the training loss,
//! the evaluation loss (when any file has one), the learning rate and the
//! tokens per second against the step, the runs overlaid in colours named
//! by a legend (the files' stems).
//!
//! Text is drawn with a TrueType font through `ab_glyph` (no system font
//! libraries). Without a font the plot is refused with one line naming the
//! font file rather than drawn without text: runs told apart by colour
//! alone, and axes without numbers, would say nothing reliable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

/// The PNG's width and height in pixels.
pub const SIZE: (u32, u32) = (1400, 1000);

/// Where the usual Linux distributions install DejaVu Sans, tried in order
/// when no font is given.
pub const FONT_CANDIDATES: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Why a plot cannot be drawn, each naming the file.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("metrics file `{}`: cannot read: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("metrics file `{}` has no steps to plot", path.display())]
    Empty { path: PathBuf },
    #[error("metrics file `{}` line {line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("-o `{}`: the folder `{}` does not exist", path.display(), folder.display())]
    NoFolder { path: PathBuf, folder: PathBuf },
    #[error("-o `{}`: the plot is a PNG; name it `….png`", path.display())]
    NotPng { path: PathBuf },
    #[error("-o `{}`: would replace the metrics file it plots", path.display())]
    ReplacesInput { path: PathBuf },
    #[error(
        "no font to write the plot's text with: none of {} exists (pass --font FILE.ttf)",
        FONT_CANDIDATES.join(", ")
    )]
    NoFont,
    #[error("--font `{}`: cannot read: {error}", path.display())]
    FontRead {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--font `{}`: not a usable TrueType font", path.display())]
    FontUnusable { path: PathBuf },
    #[error("cannot draw `{}`: {message}", path.display())]
    Draw { path: PathBuf, message: String },
}

/// One file's series, each as (step, value) in step order; a step written
/// twice (the steps after a checkpoint, run again by a resume) keeps its
/// later value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Run {
    /// The legend's name.
    pub name: String,
    pub loss: Vec<(f64, f64)>,
    pub eval_loss: Vec<(f64, f64)>,
    pub lr: Vec<(f64, f64)>,
    pub tokens_per_s: Vec<(f64, f64)>,
}

/// The series of the metrics file `path`: its step lines (with `loss`) and
/// evaluation lines (with `eval_loss`); resume markers (`resumed_from`) and
/// a last line cut short (a process killed while writing it) are skipped.
pub fn read_run(path: &Path, name: &str) -> Result<Run, PlotError> {
    let text = std::fs::read_to_string(path).map_err(|error| PlotError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let mut series: [BTreeMap<u64, f64>; 4] = Default::default();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| PlotError::Line {
            path: path.to_path_buf(),
            line: i + 1,
            message,
        };
        let value: serde_json::Value = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => continue,
            Err(e) => return Err(bad(format!("not JSON: {e}"))),
        };
        let Some(object) = value.as_object() else {
            return Err(bad("not a JSON object".into()));
        };
        if object.contains_key("resumed_from") {
            continue;
        }
        let step = object
            .get("step")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad("no whole-number `step`".into()))?;
        for (key, at) in [
            ("loss", 0),
            ("eval_loss", 1),
            ("lr", 2),
            ("tokens_per_s", 3),
        ] {
            match object.get(key) {
                // A skipped step's non-finite loss is written as null.
                None | Some(serde_json::Value::Null) => {}
                Some(v) => {
                    let v = v
                        .as_f64()
                        .ok_or_else(|| bad(format!("`{key}` is not a number")))?;
                    if v.is_finite() {
                        series[at].insert(step, v);
                    }
                }
            }
        }
    }
    if series.iter().all(BTreeMap::is_empty) {
        return Err(PlotError::Empty {
            path: path.to_path_buf(),
        });
    }
    let [loss, eval_loss, lr, tokens_per_s] =
        series.map(|s| s.into_iter().map(|(k, v)| (k as f64, v)).collect());
    Ok(Run {
        name: name.to_string(),
        loss,
        eval_loss,
        lr,
        tokens_per_s,
    })
}

/// The legend's names of `paths`: their stems, or the paths as given where
/// two stems are the same.
pub fn run_names(paths: &[PathBuf]) -> Vec<String> {
    let stem = |p: &PathBuf| {
        p.file_stem()
            .map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into())
    };
    let stems: Vec<String> = paths.iter().map(stem).collect();
    let unique = stems
        .iter()
        .enumerate()
        .all(|(i, s)| !stems[..i].contains(s));
    if unique {
        stems
    } else {
        paths.iter().map(|p| p.display().to_string()).collect()
    }
}

/// Refuses an output that cannot be written: not a `.png`, in a folder that
/// does not exist, or one of the inputs.
pub fn check_output(out: &Path, inputs: &[PathBuf]) -> Result<(), PlotError> {
    let path = out.to_path_buf();
    let png = out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        return Err(PlotError::NotPng { path });
    }
    let folder = match out.parent() {
        Some(f) if !f.as_os_str().is_empty() => f.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !folder.is_dir() {
        return Err(PlotError::NoFolder { path, folder });
    }
    if inputs.iter().any(|i| i == out) {
        return Err(PlotError::ReplacesInput { path });
    }
    Ok(())
}

/// The PNG beside a metrics file: its stem with `.png`.
pub fn beside(metrics: &Path) -> PathBuf {
    metrics.with_extension("png")
}

/// Plots the metrics files `inputs` into `out` with the font `font` (else
/// the first of [`FONT_CANDIDATES`] that exists). Every input and the
/// output are checked before anything is drawn.
pub fn plot_files(inputs: &[PathBuf], out: &Path, font: Option<&Path>) -> Result<(), PlotError> {
    check_output(out, inputs)?;
    let names = run_names(inputs);
    let runs = inputs
        .iter()
        .zip(&names)
        .map(|(path, name)| read_run(path, name))
        .collect::<Result<Vec<_>, _>>()?;
    let font = match font {
        Some(font) => font.to_path_buf(),
        None => FONT_CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or(PlotError::NoFont)?,
    };
    register(&font)?;
    draw(&runs, out).map_err(|DrawFailure(message)| PlotError::Draw {
        path: out.to_path_buf(),
        message,
    })
}

/// Registers `font` as the plots' sans-serif, once a process (plotters
/// keeps one font per family).
fn register(font: &Path) -> Result<(), PlotError> {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    if REGISTERED.get().is_some() {
        return Ok(());
    }
    let bytes = std::fs::read(font).map_err(|error| PlotError::FontRead {
        path: font.to_path_buf(),
        error,
    })?;
    // plotters keeps the font for the process's life.
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(bytes.into_boxed_slice()),
    )
    .map_err(|_| PlotError::FontUnusable {
        path: font.to_path_buf(),
    })?;
    let _ = REGISTERED.set(());
    Ok(())
}

/// What plotters said when drawing failed (its errors are generic over
/// the backend), in its words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct DrawFailure(String);

impl DrawFailure {
    fn of(error: impl std::fmt::Display) -> Self {
        Self(error.to_string())
    }
}

/// One panel: its title and each run's series of it.
struct Panel<'a> {
    title: &'static str,
    series: Vec<(&'a str, &'a [(f64, f64)])>,
}

/// The low and high ends of `values`, widened where they are equal.
fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        lo.abs().max(1.0) * 0.05
    };
    lo - pad..hi + pad
}

/// A value axis's label: plain where it reads well, else in e-notation
/// (learning rates).
fn tick(y: f64) -> String {
    if y == 0.0 || (0.01..1e5).contains(&y.abs()) {
        format!("{y:.3}")
    } else {
        format!("{y:.2e}")
    }
}

fn draw(runs: &[Run], out: &Path) -> Result<(), DrawFailure> {
    let mut panels = vec![Panel {
        title: "training loss",
        series: runs.iter().map(|r| (&*r.name, &r.loss[..])).collect(),
    }];
    if runs.iter().any(|r| !r.eval_loss.is_empty()) {
        panels.push(Panel {
            title: "evaluation loss",
            series: runs.iter().map(|r| (&*r.name, &r.eval_loss[..])).collect(),
        });
    }
    panels.push(Panel {
        title: "learning rate",
        series: runs.iter().map(|r| (&*r.name, &r.lr[..])).collect(),
    });
    panels.push(Panel {
        title: "tokens/s",
        series: runs
            .iter()
            .map(|r| (&*r.name, &r.tokens_per_s[..]))
            .collect(),
    });
    let root = BitMapBackend::new(out, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(DrawFailure::of)?;
    let areas = root.split_evenly((2, 2));
    let all = |p: &Panel, f: fn(&(f64, f64)) -> f64| -> Vec<f64> {
        p.series.iter().flat_map(|(_, s)| s.iter().map(f)).collect()
    };
    for (panel, area) in panels.iter().zip(&areas) {
        let steps = range(all(panel, |p| p.0).into_iter());
        let values = range(all(panel, |p| p.1).into_iter());
        let mut chart = ChartBuilder::on(area)
            .caption(panel.title, ("sans-serif", 24))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(steps, values)
            .map_err(DrawFailure::of)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .label_style(("sans-serif", 15))
            .y_label_formatter(&|y| tick(*y))
            .draw()
            .map_err(DrawFailure::of)?;
        for (i, (name, series)) in panel.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let line = PathElement::new(series.to_vec(), color.stroke_width(2));
            chart
                .draw_series(std::iter::once(line))
                .map_err(DrawFailure::of)?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
            // Sparse series (evaluations) show each point.
            if series.len() < 50 {
                let dots = series.iter().map(|&p| Circle::new(p, 3, color.filled()));
                chart.draw_series(dots).map_err(DrawFailure::of)?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(DrawFailure::of)?;
    }
    root.present().map_err(DrawFailure::of)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_keep_a_steps_later_value_and_skip_markers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let lines = [
            r#"{"step":1,"loss":3.0,"lr":0.1,"tokens_per_s":10.0}"#,
            r#"{"step":2,"loss":2.5,"lr":0.1,"tokens_per_s":11.0}"#,
            r#"{"resumed_from":"ck/step-1","step":1}"#,
            r#"{"step":2,"loss":2.4,"lr":0.1,"tokens_per_s":12.0}"#,
            r#"{"step":2,"eval_loss":2.6,"eval_perplexity":13.5}"#,
            r#"{"step":3,"loss":null,"lr":0.1,"tokens_per_s":12.0}"#,
            r#"{"step":4,"lo"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let run = read_run(&path, "m").unwrap();
        assert_eq!(run.loss, [(1.0, 3.0), (2.0, 2.4)]);
        assert_eq!(run.eval_loss, [(2.0, 2.6)]);
        assert_eq!(run.tokens_per_s.len(), 3);
        // Cut short anywhere but at the end is a bad file.
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let error = read_run(&path, "m").unwrap_err().to_string();
        assert!(error.contains("line 7: not JSON"), "{error}");
    }

    #[test]
    fn names_are_stems_unless_two_are_the_same() {
        let paths = |ps: &[&str]| ps.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(run_names(&paths(&["a/x.jsonl", "b/y.jsonl"])), ["x", "y"]);
        assert_eq!(
            run_names(&paths(&["a/m.jsonl", "b/m.jsonl"])),
            ["a/m.jsonl", "b/m.jsonl"]
        );
    }

    #[test]
    fn ranges_are_never_empty() {
        let around = range([2.0, 2.0].into_iter());
        assert!(around.start < 2.0 && around.end > 2.0, "{around:?}");
        assert_eq!(range(std::iter::empty()), 0.0..1.0);
    }
}
