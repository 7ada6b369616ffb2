//! GPT-2 and Llama decoders as plain burn modules.
//!
//! Both models are ordinary `burn::module::Module`s generic over the backend, so
//! they train resident with `Autodiff<B>` as well as on `Offload<B>`; both
//! implement [`burn_offload::BlockModel`] so the offload engine can run them
//! block by block. Each model file starts with its config; [`ModelConfig`]
//! names the presets and reads JSON configs.

mod adapters;
mod checks;
pub mod config;
pub mod gpt2;
pub mod hf;
pub mod kv_cache;
pub mod llama;
pub mod lora;
pub mod loss;
pub mod peft;
pub mod rope;
pub mod tokens;

pub use config::{ConfigError, ModelConfig, PRESETS};
pub use gpt2::{Gpt2, Gpt2Config};
pub use kv_cache::{CachedBlock, CachedModel, KvCache};
pub use llama::{Llama, LlamaConfig};
pub use lora::{LoraConfig, LoraError, LoraModel, LoraTarget};
pub use loss::cross_entropy;
pub use peft::{load_peft, merged_values, save_peft, MergedValues, PeftError};
