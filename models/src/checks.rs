//! What every model config checks, and the error it returns: shared by
//! [`crate::gpt2`], [`crate::llama`] and [`crate::config`], which imports
//! both models, so the checks live apart from it and nothing imports back.

/// Why a model configuration could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "unknown model preset `{name}` (known presets: {known}; or pass a path to a config .json)"
    )]
    UnknownPreset { name: String, known: String },
    // The underlying errors are part of the messages rather than `source`s,
    // so that error-chain printers do not repeat them.
    #[error("cannot read model config `{path}`: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("malformed model config `{path}`: {error}")]
    Json {
        path: String,
        error: serde_json::Error,
    },
    #[error("invalid model config: {0}")]
    Invalid(String),
}

/// Shared shape checks for attention.
pub(crate) fn check_heads(
    d_model: usize,
    n_head: usize,
    n_kv_head: usize,
) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if d_model == 0 || n_head == 0 || n_kv_head == 0 {
        return invalid("d_model and head counts must be positive".into());
    }
    if !d_model.is_multiple_of(n_head) {
        return invalid(format!(
            "d_model {d_model} is not divisible by n_head {n_head}"
        ));
    }
    if !n_head.is_multiple_of(n_kv_head) {
        return invalid(format!(
            "n_head {n_head} is not divisible by n_kv_head {n_kv_head}"
        ));
    }
    Ok(())
}

pub(crate) fn check_positive(pairs: &[(&str, usize)]) -> Result<(), ConfigError> {
    for (name, value) in pairs {
        if *value == 0 {
            return Err(ConfigError::Invalid(format!("{name} must be positive")));
        }
    }
    Ok(())
}
