//! Whether a job fits a machine, and what would fit when it does not.

use super::estimate::{host_floor, Plan, GIB};
use super::job::{Job, Machine};
use super::knobs::{HostLayout, KeptGraphs};

/// The LM head's chunk the plan suggests where a larger one does not fit.
const SMALL_LOSS_CHUNK: usize = 1024;

/// A memory a job needs more of than the machine has.
#[derive(Debug, Clone, PartialEq)]
pub enum Shortfall {
    /// Host memory: the store and buffers (or the resident model), the
    /// runtime and the OS's headroom.
    Host {
        need: u64,
        have: u64,
        /// Where `have` came from (`MemAvailable`, `--host-mem-gib`).
        source: String,
        /// The store's host bytes per parameter; `None` for a resident job.
        store_bytes_per_param: Option<u64>,
        /// With LoRA on the engine: the frozen base's host bytes per
        /// parameter (the store's figure is the adapters').
        base_bytes_per_param: Option<f64>,
    },
    /// GPU memory: the plan's device peak.
    Gpu {
        need: u64,
        have: u64,
        source: String,
    },
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shortfall::Host {
                need,
                have,
                source,
                store_bytes_per_param,
                base_bytes_per_param,
            } => {
                let store = match (base_bytes_per_param, store_bytes_per_param) {
                    (Some(b), _) => format!(
                        " ({b:.2} B/param for the frozen base, the adapters' state, buffers, the \
                         runtime and the OS's headroom; --plan lists them)"
                    ),
                    (None, None) => {
                        " (the model, the runtime and the OS's headroom; --plan lists them)"
                            .to_string()
                    }
                    (None, Some(b)) => format!(
                        " ({b} B/param in the store, buffers, the runtime and the OS's headroom; \
                         --plan lists them)"
                    ),
                };
                // The lent GPU hosts grow RAM on demand: MemAvailable at start can understate.
                let grows = if source == "MemAvailable" {
                    "; pass --host-mem-gib if this machine's memory grows on demand"
                } else {
                    ""
                };
                write!(
                    f,
                    "not enough host memory: needs {:.2} GiB{store}, {:.2} GiB available ({source}){grows}",
                    *need as f64 / GIB,
                    *have as f64 / GIB,
                )
            }
            Shortfall::Gpu { need, have, source } => write!(
                f,
                "not enough GPU memory: needs {:.2} GiB, {:.2} GiB available ({source})",
                *need as f64 / GIB,
                *have as f64 / GIB,
            ),
        }
    }
}

/// A job that does not fit its machine: what is short, and what would fit.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}; {suggestion}", shortfalls.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct DoesNotFit {
    pub shortfalls: Vec<Shortfall>,
    /// What would fit: fewer kept graphs, fused mode, the engine, a smaller batch.
    pub suggestion: String,
}

impl Plan {
    /// `Ok` when the job fits; otherwise what is needed, what is available,
    /// and what would fit.
    pub fn check(&self, job: &Job, machine: &Machine) -> Result<(), DoesNotFit> {
        let (host, device) = self.needs(machine);
        let mut shortfalls = Vec::new();
        if host > machine.host_bytes {
            shortfalls.push(Shortfall::Host {
                need: host,
                have: machine.host_bytes,
                source: machine.host_source.clone(),
                store_bytes_per_param: (!job.resident).then(|| job.store_bytes_per_param()),
                base_bytes_per_param: job
                    .frozen_host_bytes
                    .filter(|_| !job.resident)
                    .map(|bytes| bytes as f64 / job.config.num_params() as f64),
            });
        }
        if let (Some(need), Some(have)) = (device, machine.device_bytes) {
            if need > have {
                shortfalls.push(Shortfall::Gpu {
                    need,
                    have,
                    source: machine.device_source.clone(),
                });
            }
        }
        if shortfalls.is_empty() {
            return Ok(());
        }
        Err(DoesNotFit {
            shortfalls,
            suggestion: suggestion(job, machine),
        })
    }
}

/// What would fit: fewer kept graphs, fused mode, the engine instead of
/// resident, a smaller batch.
fn suggestion(job: &Job, machine: &Machine) -> String {
    let fits = |j: &Job| Plan::new(j).check_quiet(machine);
    let floor = host_floor(job.gpu);
    if machine.host_bytes < floor {
        return format!(
            "the runtime and the OS's headroom alone take {:.2} GiB",
            floor as f64 / GIB
        );
    }
    let mut tries = Vec::new();
    if !job.resident && job.kept_graphs.count() > 0 {
        let fewer = Job {
            kept_graphs: KeptGraphs::Auto,
            ..job.clone()
        }
        .place_kept_graphs(machine);
        let what = format!(
            "--keep-graphs {} (or auto: as many as fit)",
            fewer.kept_graphs
        );
        tries.push((fewer, what));
    }
    // A LoRA job streams with its base's format counted (`frozen_host_bytes`).
    if job.resident && (job.trained_params.is_none() || job.frozen_host_bytes.is_some()) {
        tries.push((
            Job {
                resident: false,
                ..job.clone()
            },
            "drop --resident (stream from host memory)".to_string(),
        ));
    }
    // `--base-dtype` is the engine's (a resident run is told to stream first).
    for &(name, bytes) in job.smaller_bases.iter().filter(|_| !job.resident) {
        tries.push((
            Job {
                frozen_host_bytes: Some(bytes),
                ..job.clone()
            },
            format!("--base-dtype {name} (the frozen base in {name})"),
        ));
    }
    // The LM head's logits of a chunk grow with the vocabulary: at 128k,
    // 4,096 tokens' take 10 GiB.
    if !job.resident && job.loss_chunk_tokens > SMALL_LOSS_CHUNK {
        tries.push((
            Job {
                loss_chunk_tokens: SMALL_LOSS_CHUNK,
                ..job.clone()
            },
            format!("--loss-chunk-tokens {SMALL_LOSS_CHUNK}"),
        ));
    }
    if job.compact_applies() && !job.compact() {
        tries.push((
            Job {
                host_layout: HostLayout::Compact,
                ..job.clone()
            },
            "--host-layout compact (no bf16 weights on the host; bf16 block gradients)".to_string(),
        ));
    }
    if !job.fused && !job.resident {
        tries.push((
            Job {
                fused: true,
                accum: 1,
                ..job.clone()
            },
            "--fused (12 B/param on the host)".to_string(),
        ));
    }
    for (candidate, what) in &tries {
        if fits(candidate) {
            return format!("try {what}");
        }
    }
    let mut base = job.clone();
    if !fits(&base) && !base.resident && !base.fused {
        base.fused = true;
    }
    for batch in (1..job.batch).rev() {
        let smaller = Job {
            batch,
            ..base.clone()
        };
        if fits(&smaller) {
            let fused = if base.fused && !job.fused {
                " --fused"
            } else {
                ""
            };
            return format!(
                "try --batch {batch}{fused} (with --accum to keep the tokens per step)"
            );
        }
    }
    if job.fused || job.resident {
        "no batch size fits: try a smaller model or a larger machine".into()
    } else {
        "no batch size fits: try --fused (12 B/param on the host) with a smaller model, or a larger machine".into()
    }
}
