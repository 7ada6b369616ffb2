//! The report of a results folder: `bench.json`, `bench.md` (the rows and
//! the ratios) and `bench.png`.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::rows::{read_rows, Row};
use super::{label, ratios, system_rank, Ratio};

fn cell(x: Option<f64>, digits: usize) -> String {
    x.map_or("—".into(), |x| format!("{x:.digits$}"))
}

pub(super) fn markdown(rows: &[Row], ratios: &[Ratio], command: &str, notes: &[String]) -> String {
    let mut md = String::from("# burn-offload vs resident burn and PyTorch on the GPU\n\n");
    if !command.is_empty() {
        md += &format!("Command: `{command}`\n\n");
    }
    for note in notes {
        md += &format!("Note: {note}.\n\n");
    }
    md += "Tokens/s: median of the steps after the first two. Model TFLOPS: 6 · parameters · \
           tokens/s. Hardware TFLOPS adds burn-offload's recompute (2 · block parameters · \
           tokens per backward pass, for the blocks whose forward graph was not kept). GPU peak: whole process, polled with nvidia-smi. H2D/D2H: \
           achieved rates of the engine's copies, timed on their streams.\n\n";
    md += "| shape | tokens/step | system | tok/s | model TFLOPS | hw TFLOPS | GPU peak GiB | host peak GiB | H2D fwd GB/s | H2D bwd GB/s | D2H GB/s |\n";
    md += "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        let tok = if r.ok {
            cell(r.tok_s, 0)
        } else {
            r.note.clone().unwrap_or_default()
        };
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.shape,
            r.tokens_per_step,
            label(&r.system),
            tok,
            cell(r.model_tflops, 1),
            cell(r.hardware_tflops, 1),
            cell(r.gpu_peak_gib, 1),
            cell(r.host_peak_gib, 1),
            cell(r.h2d_forward_gb_s, 1),
            cell(r.h2d_backward_gb_s, 1),
            cell(r.d2h_gb_s, 1),
        );
    }
    let split_rows: Vec<&Row> = rows.iter().filter(|r| !r.split_s.is_empty()).collect();
    if !split_rows.is_empty() {
        md += "\n## Step split of the burn-offload rows (median seconds)\n\n";
        md +=
            "`backward` contains `backward_wait` (the device finishing a block), `download` and, \
               in fused mode, the optimizer work that overlaps it. In the default pipelined mode \
               `optimizer` is the previous step's deferred update, run inside `forward`.\n\n";
        let keys = [
            "forward",
            "head",
            "backward",
            "backward_wait",
            "download",
            "optimizer",
        ];
        md += &format!("| shape | tokens/step | system | {} |\n", keys.join(" | "));
        md += &format!("|---|---:|---|{}\n", "---:|".repeat(keys.len()));
        for r in split_rows {
            let cells: Vec<String> = keys
                .iter()
                .map(|k| cell(r.split_s.get(*k).copied(), 2))
                .collect();
            md += &format!(
                "| {} | {} | {} | {} |\n",
                r.shape,
                r.tokens_per_step,
                label(&r.system),
                cells.join(" | ")
            );
        }
    }
    if !ratios.is_empty() {
        md += "\n## Ratios (tokens/s, same run)\n\n| shape | tokens/step | ratio | value | target | met |\n|---|---:|---|---:|---:|---|\n";
        for q in ratios {
            let (target, met) = match q.target {
                Some(t) => (format!("≥ {t}"), if q.value >= t { "yes" } else { "no" }),
                None => ("—".into(), "—"),
            };
            md += &format!(
                "| {} | {} | {} | {:.2} | {} | {} |\n",
                q.shape, q.tokens_per_step, q.what, q.value, target, met
            );
        }
    }
    md
}

/// The GPU the rows ran on, from the `gpu.txt` that `pipeline.sh` writes
/// (nvidia-smi's name, memory, driver); "GPU" when it is missing.
pub(super) fn gpu_name(results: &Path) -> String {
    fs::read_to_string(results.join("gpu.txt"))
        .ok()
        .and_then(|text| {
            let name = text.lines().next()?.split(',').next()?.trim().to_string();
            (!name.is_empty()).then_some(name)
        })
        .unwrap_or_else(|| "GPU".into())
}

pub(super) fn plot(rows: &[Row], gpu: &str, path: &Path, font: &Path) -> Result<()> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    use plotters::style::FontStyle;

    let bytes = fs::read(font).with_context(|| {
        format!(
            "cannot read the plot font `{}` (pass --font with a TrueType file)",
            font.display()
        )
    })?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(bytes.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("`{}` is not a usable TrueType font", font.display()))?;

    let mut groups: Vec<(String, u64)> = rows
        .iter()
        .map(|r| (r.shape.clone(), r.tokens_per_step))
        .collect();
    groups.dedup();
    let mut systems: Vec<String> = rows.iter().map(|r| r.system.clone()).collect();
    systems.sort_by_key(|s| system_rank(s));
    systems.dedup();
    let max = rows.iter().filter_map(|r| r.tok_s).fold(0.0, f64::max) * 1.15;
    if max <= 0.0 {
        bail!("no row has a tokens/s figure to plot");
    }

    let root = BitMapBackend::new(path, (1400, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (chart_area, legend_area) = root.split_horizontally(1000);
    let n = groups.len() as f64;
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(
            format!("Training throughput on {gpu}, tokens/s"),
            ("sans-serif", 26),
        )
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n, 0.0..max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .y_desc("tokens/s")
        .label_style(("sans-serif", 16))
        .draw()?;
    let width = 0.8 / systems.len() as f64;
    for (si, system) in systems.iter().enumerate() {
        let color = Palette99::pick(si).filled();
        let bars = groups
            .iter()
            .enumerate()
            .filter_map(|(gi, (shape, tokens))| {
                let r = rows.iter().find(|r| {
                    &r.shape == shape && r.tokens_per_step == *tokens && &r.system == system
                })?;
                let x0 = gi as f64 + 0.1 + si as f64 * width;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + width * 0.9, r.tok_s.unwrap_or(0.0))],
                    color,
                ))
            });
        chart.draw_series(bars)?;
    }
    // Each group's name above its bars (the x axis has no numeric meaning).
    let top =
        TextStyle::from(("sans-serif", 17).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    chart.draw_series(groups.iter().enumerate().map(|(gi, (shape, tokens))| {
        Text::new(
            format!("{shape}, {}k tokens/step", tokens / 1024),
            (gi as f64 + 0.5, max * 0.98),
            top.clone(),
        )
    }))?;
    for (si, system) in systems.iter().enumerate() {
        let y = 80 + si as i32 * 34;
        legend_area.draw(&Rectangle::new(
            [(10, y), (34, y + 20)],
            Palette99::pick(si).filled(),
        ))?;
        legend_area.draw(&Text::new(label(system), (44, y + 2), ("sans-serif", 17)))?;
    }
    legend_area.draw(&Text::new(
        "missing bar: out of memory or not run",
        (10, 80 + systems.len() as i32 * 34 + 10),
        ("sans-serif", 15),
    ))?;
    root.present()?;
    Ok(())
}

/// Reads the rows in `results` and writes `bench.json`, `bench.md` and
/// `bench.png` into `out`; `notes` (rows left out and why) go into the
/// JSON and the markdown.
pub(super) fn write_report(
    results: &Path,
    out: &Path,
    command: &str,
    notes: &[String],
    font: &Path,
) -> Result<()> {
    let rows = read_rows(results)?;
    let ratios = ratios(&rows);
    fs::create_dir_all(out).with_context(|| format!("cannot create `{}`", out.display()))?;
    let json = serde_json::json!({
        "command": command,
        "notes": notes,
        "rows": rows,
        "ratios": ratios,
    });
    fs::write(out.join("bench.json"), serde_json::to_string_pretty(&json)?)?;
    fs::write(
        out.join("bench.md"),
        markdown(&rows, &ratios, command, notes),
    )?;
    plot(&rows, &gpu_name(results), &out.join("bench.png"), font)?;
    println!(
        "{} rows, {} ratios → {}/bench.{{json,md,png}}",
        rows.len(),
        ratios.len(),
        out.display()
    );
    Ok(())
}
