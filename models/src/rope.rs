//! Rotary position tables: built on the host in f64, cached per backend,
//! device and frequencies, and gathered per position where packed windows
//! restart positions at each document; the frequencies' scaling (Llama 3.x,
//! linear interpolation).

use std::any::{Any, TypeId};
use std::sync::Mutex;

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use burn_offload::ops::rotary::{rotate_half, rotate_half_rows};
use burn_offload::Documents;
use serde::{Deserialize, Serialize};

use crate::checks::ConfigError;

/// Rotary tables `(cos, sin)`, each `[seq, head_dim]`: position `t`, column `j`
/// holds `cos(t · inv_freqs[j mod h/2])` (halves repeated, HF layout), where
/// `inv_freqs` has `head_dim / 2` entries ([`LlamaConfig::inv_freqs`]).
/// Computed in f64 on the host so every backend sees the same angles.
pub fn rope_tables<B: Backend>(
    seq: usize,
    inv_freqs: &[f64],
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let half = inv_freqs.len();
    let head_dim = 2 * half;
    let mut cos = Vec::with_capacity(seq * head_dim);
    let mut sin = Vec::with_capacity(seq * head_dim);
    for t in 0..seq {
        for j in 0..head_dim {
            let angle = t as f64 * inv_freqs[j % half];
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    let table = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [seq, head_dim]), device);
    (table(cos), table(sin))
}

/// [`rope_tables`] for `seq` positions, built once per backend, device and
/// frequencies and shared by every block and step: the tables for the
/// longest sequence asked for so far (rounded up to a power of two), narrowed
/// to `seq` (a row depends only on its position, so the values are those of
/// [`rope_tables`]). Built per call, each block's forward would compute the
/// angles on the thread that submits the kernels and upload them, a copy that
/// on the GPU queues behind the next block's weight prefetch.
///
/// Process-wide rather than owned by the model: a module's non-parameter
/// state must be the same type on every backend (burn converts modules to and
/// from `Autodiff` each step), and the tables are tensors of one backend.
/// The key (backend, device, frequencies) keeps two models apart.
pub fn cached_rope_tables<B: Backend>(
    seq: usize,
    inv_freqs: &[f64],
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    struct Entry {
        key: (TypeId, String, Vec<u64>),
        positions: usize,
        tables: Box<dyn Any + Send>,
    }
    static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

    let key = (
        TypeId::of::<B>(),
        format!("{device:?}"),
        inv_freqs.iter().map(|f| f.to_bits()).collect(),
    );
    // A panic elsewhere while the lock was held cannot leave an entry half
    // written (entries are replaced whole): the cache stays usable.
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let at = match cache.iter().position(|e| e.key == key) {
        Some(at) if cache[at].positions >= seq => at,
        found => {
            let positions = seq.next_power_of_two();
            let entry = Entry {
                key,
                positions,
                tables: Box::new(rope_tables::<B>(positions, inv_freqs, device)),
            };
            match found {
                Some(at) => {
                    cache[at] = entry;
                    at
                }
                None => {
                    cache.push(entry);
                    cache.len() - 1
                }
            }
        }
    };
    let (cos, sin) = cache[at]
        .tables
        .downcast_ref::<(Tensor<B, 2>, Tensor<B, 2>)>()
        .expect("the key holds the backend type");
    if cache[at].positions == seq {
        (cos.clone(), sin.clone())
    } else {
        (cos.clone().narrow(0, 0, seq), sin.clone().narrow(0, 0, seq))
    }
}

/// Rotates `x [batch, heads, seq, head_dim]`: `x·cos + rotate_half(x)·sin`, where
/// `rotate_half([a, b]) = [-b, a]` over the two halves of the head dimension, in
/// `x`'s dtype: one operation each way (`burn_offload::ops::rotary`), a kernel on CUDA.
pub fn apply_rope<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 2>,
    sin: &Tensor<B, 2>,
) -> Tensor<B, 4> {
    rotate_half(x, cos, sin)
}

/// Rotary tables `(cos, sin)` of each position's offset in its document,
/// `[batch, seq, head_dim]` (Hugging Face's `position_ids` for packed
/// sequences): rows of [`cached_rope_tables`] gathered by
/// [`Documents::positions`].
pub fn document_rope_tables<B: Backend>(
    documents: &Documents,
    inv_freqs: &[f64],
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let [batch, seq] = documents.dims();
    let (cos, sin) = cached_rope_tables::<B>(documents.longest(), inv_freqs, device);
    let positions = Tensor::<B, 1, Int>::from_data(
        TensorData::new(documents.positions(), [batch * seq]),
        device,
    );
    let head_dim = cos.dims()[1];
    let rows = |t: Tensor<B, 2>| {
        t.select(0, positions.clone())
            .reshape([batch, seq, head_dim])
    };
    (rows(cos), rows(sin))
}

/// [`apply_rope`] with tables per row, `[batch, seq, head_dim]`
/// ([`document_rope_tables`]).
pub fn apply_rope_rows<B: Backend>(
    x: Tensor<B, 4>,
    cos: &Tensor<B, 3>,
    sin: &Tensor<B, 3>,
) -> Tensor<B, 4> {
    rotate_half_rows(x, cos, sin)
}

/// Rotary frequency scaling, as in Hugging Face's `rope_scaling`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Every frequency divided by `factor` (position interpolation).
    Linear { factor: f64 },
    /// Llama 3.x: low frequencies divided by `factor`, high ones kept, a
    /// smooth blend between (wavelengths measured against the original
    /// context length).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// The scaled inverse frequency for `inv_freq` (radians per position).
    pub fn scale(&self, inv_freq: f64) -> f64 {
        match *self {
            RopeScaling::Linear { factor } => inv_freq / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let original = original_max_position_embeddings as f64;
                let wavelength = 2.0 * std::f64::consts::PI / inv_freq;
                if wavelength < original / high_freq_factor {
                    inv_freq
                } else if wavelength > original / low_freq_factor {
                    inv_freq / factor
                } else {
                    let smooth = (original / wavelength - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
                }
            }
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ConfigError::Invalid(format!(
                    "rope_scaling {name} must be positive, got {v}"
                )))
            }
        };
        match *self {
            RopeScaling::Linear { factor } => positive("factor", factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                positive(
                    "original_max_position_embeddings",
                    original_max_position_embeddings as f64,
                )?;
                if high_freq_factor <= low_freq_factor {
                    return Err(ConfigError::Invalid(
                        "rope_scaling high_freq_factor must exceed low_freq_factor".into(),
                    ));
                }
                Ok(())
            }
        }
    }
}
