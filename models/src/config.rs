//! Model configurations: named presets and JSON files.

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use crate::checks::ConfigError;
use crate::{Gpt2Config, LlamaConfig};

/// Either model family, tagged by `"arch"` in JSON:
/// `{"arch": "llama", "vocab_size": 256, "d_model": 64, ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "arch", rename_all = "lowercase")]
pub enum ModelConfig {
    Gpt2(Gpt2Config),
    Llama(LlamaConfig),
}

/// Preset names accepted by [`ModelConfig::preset`]. `tiny` is `gpt2-tiny`.
pub const PRESETS: &[&str] = &[
    "tiny",
    "gpt2-tiny",
    "llama-tiny",
    "gpt2-124m",
    "gpt2-xl",
    "llama-1b",
    "llama-3b",
    "llama-7b",
    "llama-8b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "mistral-7b",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen3-0.6b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-14b",
];

impl ModelConfig {
    /// A named preset (shapes of the public models; `*-tiny` for tests and CPU runs).
    pub fn preset(name: &str) -> Result<Self, ConfigError> {
        let config = match name {
            "tiny" | "gpt2-tiny" => ModelConfig::Gpt2(Gpt2Config::tiny()),
            "llama-tiny" => ModelConfig::Llama(LlamaConfig::tiny()),
            "gpt2-124m" => ModelConfig::Gpt2(Gpt2Config::gpt2_124m()),
            "gpt2-xl" => ModelConfig::Gpt2(Gpt2Config::gpt2_xl()),
            "llama-1b" => ModelConfig::Llama(LlamaConfig::llama_1b()),
            "llama-3b" => ModelConfig::Llama(LlamaConfig::llama_3b()),
            "llama-7b" => ModelConfig::Llama(LlamaConfig::llama_7b()),
            "llama-8b" => ModelConfig::Llama(LlamaConfig::llama_8b()),
            "llama-3.2-1b" => ModelConfig::Llama(LlamaConfig::llama_3_2_1b()),
            "llama-3.2-3b" => ModelConfig::Llama(LlamaConfig::llama_3_2_3b()),
            "llama-3.1-8b" => ModelConfig::Llama(LlamaConfig::llama_3_1_8b()),
            "llama-3.1-70b" => ModelConfig::Llama(LlamaConfig::llama_3_1_70b()),
            "llama-3.1-405b" => ModelConfig::Llama(LlamaConfig::llama_3_1_405b()),
            "mistral-7b" => ModelConfig::Llama(LlamaConfig::mistral_7b()),
            "qwen2.5-0.5b" => ModelConfig::Llama(LlamaConfig::qwen2_5_0_5b()),
            "qwen2.5-1.5b" => ModelConfig::Llama(LlamaConfig::qwen2_5_1_5b()),
            "qwen2.5-7b" => ModelConfig::Llama(LlamaConfig::qwen2_5_7b()),
            "qwen2.5-14b" => ModelConfig::Llama(LlamaConfig::qwen2_5_14b()),
            "qwen2.5-32b" => ModelConfig::Llama(LlamaConfig::qwen2_5_32b()),
            "qwen2.5-72b" => ModelConfig::Llama(LlamaConfig::qwen2_5_72b()),
            "qwen3-0.6b" => ModelConfig::Llama(LlamaConfig::qwen3_0_6b()),
            "qwen3-4b" => ModelConfig::Llama(LlamaConfig::qwen3_4b()),
            "qwen3-8b" => ModelConfig::Llama(LlamaConfig::qwen3_8b()),
            "qwen3-14b" => ModelConfig::Llama(LlamaConfig::qwen3_14b()),
            _ => {
                return Err(ConfigError::UnknownPreset {
                    name: name.to_string(),
                    known: PRESETS.join(", "),
                })
            }
        };
        Ok(config)
    }

    /// Parses a JSON config.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: ModelConfig =
            serde_json::from_str(text).map_err(|error| ConfigError::Json {
                path: origin.to_string(),
                error,
            })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads a JSON config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Io {
            path: path.display().to_string(),
            error,
        })?;
        // Editors on Windows may start a UTF-8 file with a byte-order mark.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        Self::from_json(text, &path.display().to_string())
    }

    /// `--model` argument: a preset name, or a path to a `.json` config.
    pub fn from_arg(arg: &str) -> Result<Self, ConfigError> {
        let path = Path::new(arg);
        if arg.ends_with(".json") || path.is_file() {
            Self::from_file(path)
        } else {
            Self::preset(arg)
        }
    }

    /// Checks that the shapes are consistent.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            ModelConfig::Gpt2(c) => c.validate(),
            ModelConfig::Llama(c) => c.validate(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.vocab_size,
            ModelConfig::Llama(c) => c.vocab_size,
        }
    }

    pub fn set_vocab_size(&mut self, vocab_size: usize) {
        match self {
            ModelConfig::Gpt2(c) => c.vocab_size = vocab_size,
            ModelConfig::Llama(c) => c.vocab_size = vocab_size,
        }
    }

    /// Longest sequence the model accepts (GPT-2's learned positions; Llama's RoPE
    /// has no hard limit but we keep the configured context length, and the
    /// sliding window where the model has one).
    pub fn max_seq_len(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.n_ctx,
            ModelConfig::Llama(c) => c.max_seq_len(),
        }
    }

    pub fn n_layer(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.n_layer,
            ModelConfig::Llama(c) => c.n_layer,
        }
    }

    /// Width of attention's queries over all heads (`heads × head size`):
    /// each of attention's products is `seq × seq × this` multiply-adds a
    /// sequence and layer.
    pub fn attention_width(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.d_model,
            ModelConfig::Llama(c) => c.n_head * c.head_dim(),
        }
    }

    /// Number of trainable parameters.
    pub fn num_params(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.num_params(),
            ModelConfig::Llama(c) => c.num_params(),
        }
    }

    /// Parameters of one block (every block has the same).
    pub fn block_params(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.block_params(),
            ModelConfig::Llama(c) => c.block_params(),
        }
    }

    /// Parameters outside the blocks: embeddings, final norm, an untied head.
    pub fn stem_params(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.stem_params(),
            ModelConfig::Llama(c) => c.stem_params(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_round_trips_through_json() {
        for name in PRESETS {
            let config = ModelConfig::preset(name).unwrap();
            config.validate().unwrap();
            let json = serde_json::to_string(&config).unwrap();
            assert_eq!(ModelConfig::from_json(&json, "test").unwrap(), config);
        }
    }

    #[test]
    fn preset_sizes_match_the_public_models() {
        let billions = |name: &str| ModelConfig::preset(name).unwrap().num_params() as f64 / 1e9;
        assert!((billions("gpt2-124m") - 0.124).abs() < 0.002);
        assert!((billions("gpt2-xl") - 1.558).abs() < 0.01);
        assert!((billions("llama-7b") - 6.738).abs() < 0.01);
        assert!((billions("llama-8b") - 8.03).abs() < 0.01);
        // The published parameter counts of the families' checkpoints.
        for (name, published) in [
            ("llama-3.2-1b", 1.236),
            ("llama-3.2-3b", 3.213),
            ("llama-3.1-8b", 8.030),
            ("mistral-7b", 7.242),
            ("qwen2.5-0.5b", 0.494),
            ("qwen2.5-1.5b", 1.544),
            ("qwen2.5-7b", 7.616),
            ("qwen2.5-14b", 14.770),
            ("qwen2.5-32b", 32.764),
            ("qwen2.5-72b", 72.706),
            ("llama-3.1-70b", 70.554),
            ("llama-3.1-405b", 405.853),
            ("qwen3-0.6b", 0.596),
            ("qwen3-4b", 4.022),
            ("qwen3-8b", 8.191),
            ("qwen3-14b", 14.768),
        ] {
            let got = billions(name);
            assert!(
                (got - published).abs() < 0.005 * published,
                "{name}: {got:.3}B, published {published}B"
            );
        }
        // Exactly, where the model cards give the count to the parameter.
        for (name, published) in [
            ("gpt2-124m", 124_439_808),
            ("llama-3.2-1b", 1_235_814_400),
            ("llama-3.1-8b", 8_030_261_248),
            ("llama-3.1-70b", 70_553_706_496),
            ("mistral-7b", 7_241_732_096),
        ] {
            let got = ModelConfig::preset(name).unwrap().num_params();
            assert_eq!(got, published, "{name}");
        }
    }

    #[test]
    fn unknown_preset_and_bad_json_are_clear_errors() {
        let err = ModelConfig::preset("gpt5").unwrap_err().to_string();
        assert!(
            err.contains("unknown model preset `gpt5`") && err.contains("llama-7b"),
            "{err}"
        );
        let err = ModelConfig::from_json("{\"arch\": \"llama\", \"d_model\": ", "x.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("malformed model config `x.json`"), "{err}");
        let err = ModelConfig::from_json("{\"arch\": \"rnn\"}", "x.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("malformed"), "{err}");
    }

    #[test]
    fn inconsistent_shapes_are_rejected() {
        let mut c = LlamaConfig::tiny();
        c.n_kv_head = 3;
        let json = serde_json::to_string(&ModelConfig::Llama(c)).unwrap();
        let err = ModelConfig::from_json(&json, "x").unwrap_err().to_string();
        assert!(err.contains("not divisible by n_kv_head"), "{err}");
    }
}
