//! The rows of a results folder: what each burn or PyTorch row left
//! (`.summary.json`, `.torch.json`, its stderr) read into a [`Row`].

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

use super::system_rank;

/// One bench row: a system on a shape at a number of tokens per step.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub(super) shape: String,
    pub(super) tokens_per_step: u64,
    pub(super) system: String,
    pub(super) ok: bool,
    /// Why a row has no figures (out of memory, timed out, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) note: Option<String>,
    pub(super) tok_s: Option<f64>,
    pub(super) step_s: Option<f64>,
    pub(super) model_tflops: Option<f64>,
    pub(super) hardware_tflops: Option<f64>,
    /// Whole-process GPU memory peak (nvidia-smi), GiB.
    pub(super) gpu_peak_gib: Option<f64>,
    /// Host peak resident set, GiB.
    pub(super) host_peak_gib: Option<f64>,
    pub(super) h2d_forward_gb_s: Option<f64>,
    pub(super) h2d_backward_gb_s: Option<f64>,
    pub(super) d2h_gb_s: Option<f64>,
    /// Median seconds per phase (burn-offload rows).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) split_s: BTreeMap<String, f64>,
}

/// `bench-<shape>-<N>k-<system>` → (shape, tokens, system).
pub(super) fn parse_name(stem: &str) -> Option<(String, u64, String)> {
    let rest = stem.strip_prefix("bench-")?;
    let (shape, rest) = rest.split_once('-')?;
    let (tokens, system) = rest.split_once('-')?;
    let k: u64 = tokens.strip_suffix('k')?.parse().ok()?;
    Some((shape.to_string(), k * 1024, system.to_string()))
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// The last lines of a row's stderr, for a failed row's note.
fn failure_note(results: &Path, stem: &str) -> String {
    for ext in ["tail", "err"] {
        if let Ok(text) = fs::read_to_string(results.join(format!("{stem}.{ext}"))) {
            let lower = text.to_lowercase();
            if ["out of memory", "out_of_memory", "outofmemory"]
                .iter()
                .any(|m| lower.contains(m))
            {
                return "out of GPU memory".into();
            }
            if lower.contains("non-zero status 124") {
                return "killed by the time limit".into();
            }
            // The program's own error line; /usr/bin/time's exit line last.
            let lines = || text.lines().rev().map(str::trim).filter(|l| !l.is_empty());
            let line = lines()
                .find(|l| l.starts_with("error"))
                .or_else(|| lines().find(|l| !l.starts_with("Command exited")));
            if let Some(line) = line {
                // The first clause says what failed; the planner's suggestion follows.
                let clause = line.split(';').next().unwrap_or(line);
                return clause.chars().take(120).collect();
            }
        }
    }
    "no steps completed (killed by the time limit?)".into()
}

fn burn_row(results: &Path, stem: &str, v: &Value) -> Result<Row> {
    let (shape, tokens_per_step, system) =
        parse_name(stem).with_context(|| format!("unexpected row name `{stem}`"))?;
    let tok_s = num(v, "tok_s_median");
    let split_s = v
        .get("split_median_s")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.ends_with("_s") && !k.ends_with("copy_s"))
                .filter_map(|(k, x)| Some((k.trim_end_matches("_s").to_string(), x.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    Ok(Row {
        ok: tok_s.is_some(),
        note: tok_s.is_none().then(|| failure_note(results, stem)),
        tok_s,
        step_s: num(v, "step_s_median"),
        model_tflops: num(v, "model_tflops_median"),
        hardware_tflops: num(v, "hardware_tflops_median"),
        gpu_peak_gib: num(v, "gpu_peak_mib").map(|m| m / 1024.0),
        host_peak_gib: num(v, "host_peak_gib"),
        h2d_forward_gb_s: num(v, "h2d_forward_gb_s"),
        h2d_backward_gb_s: num(v, "h2d_backward_gb_s"),
        d2h_gb_s: num(v, "d2h_gb_s"),
        split_s,
        shape,
        tokens_per_step,
        system,
    })
}

fn torch_row(results: &Path, stem: &str, v: Option<&Value>) -> Result<Row> {
    let (shape, tokens_per_step, system) =
        parse_name(stem).with_context(|| format!("unexpected row name `{stem}`"))?;
    let ok = v.and_then(|v| v.get("ok")).and_then(Value::as_bool) == Some(true);
    let get = |key| v.and_then(|v| num(v, key));
    // The whole-process peak polled with nvidia-smi, as for the burn rows;
    // torch's own reserved figure when the poll is missing.
    let smi = fs::read_to_string(results.join(format!("{stem}.smi")))
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .map(|mib| mib / 1024.0);
    let note = (!ok).then(|| {
        v.and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .map(|e| {
                if e.contains("out of memory") {
                    "out of GPU memory".to_string()
                } else {
                    e.chars().take(120).collect()
                }
            })
            .unwrap_or_else(|| failure_note(results, stem))
    });
    Ok(Row {
        ok,
        note,
        tok_s: get("tok_s_median"),
        step_s: get("step_s_median"),
        model_tflops: get("model_tflops"),
        // PyTorch rows with checkpointing recompute too; their figure is
        // reported as model FLOPs only.
        hardware_tflops: None,
        gpu_peak_gib: smi.or(get("gpu_peak_reserved_gib")),
        host_peak_gib: get("host_peak_gib"),
        h2d_forward_gb_s: None,
        h2d_backward_gb_s: None,
        d2h_gb_s: None,
        split_s: BTreeMap::new(),
        shape,
        tokens_per_step,
        system,
    })
}

pub(super) fn read_rows(results: &Path) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let entries = fs::read_dir(results)
        .with_context(|| format!("cannot read results folder `{}`", results.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("bench-"))
        .collect();
    names.sort();
    for name in names {
        let path = results.join(&name);
        if let Some(stem) = name.strip_suffix(".summary.json") {
            let text = fs::read_to_string(&path)?;
            // A run killed before its summary leaves an empty file: the row
            // is reported as failed, like a run that made no step.
            let v: Value = if text.trim().is_empty() {
                serde_json::json!({ "steps": 0 })
            } else {
                serde_json::from_str(text.trim())
                    .with_context(|| format!("`{}` is not JSON", path.display()))?
            };
            rows.push(burn_row(results, stem, &v)?);
        } else if let Some(stem) = name.strip_suffix(".torch.json") {
            let text = fs::read_to_string(&path)?;
            // A killed peer leaves an empty file: the row is reported as failed.
            let v: Option<Value> = text
                .lines()
                .rev()
                .find(|l| l.trim_start().starts_with('{'))
                .map(serde_json::from_str)
                .transpose()
                .with_context(|| format!("`{}` is not JSON", path.display()))?;
            rows.push(torch_row(results, stem, v.as_ref())?);
        }
    }
    if rows.is_empty() {
        bail!(
            "no bench rows (bench-*.summary.json or bench-*.torch.json) in `{}`",
            results.display()
        );
    }
    rows.sort_by(|a, b| {
        (&a.shape, a.tokens_per_step, system_rank(&a.system)).cmp(&(
            &b.shape,
            b.tokens_per_step,
            system_rank(&b.system),
        ))
    });
    Ok(rows)
}
