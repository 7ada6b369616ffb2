//! LoRA's options: low-rank adapters trained on a frozen model, and the
//! files they are written to.

use std::path::PathBuf;

use burn_offload::quant::{BaseDtype, QuantError};
use burn_offload::FrozenDtype;

/// `--lora-*`: train low-rank adapters on the frozen model instead of every
/// weight, as PEFT's `LoraConfig` does (its names and defaults).
#[derive(Debug, Clone, clap::Args)]
pub struct LoraOptions {
    /// Train LoRA adapters of this rank on the frozen model instead of every
    /// weight (0, the default: every weight trains).
    #[arg(long, default_value_t = 0)]
    pub lora_rank: usize,
    /// The adapters' scale: their output is multiplied by alpha / rank
    /// (alpha / √rank with --rslora). PEFT's default.
    #[arg(long, default_value_t = 8.0)]
    pub lora_alpha: f64,
    /// Dropout on the adapters' input, in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    pub lora_dropout: f64,
    /// The layers given adapters, by their Hugging Face names, comma
    /// separated (Llama family: q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj; GPT-2: c_attn, c_proj, c_fc). Default: PEFT's
    /// for the family (q_proj,v_proj; GPT-2 c_attn).
    #[arg(long, value_delimiter = ',')]
    pub lora_targets: Vec<String>,
    /// Scale the adapters by alpha / √rank (rank-stabilised LoRA).
    #[arg(long)]
    pub rslora: bool,
    /// Train the token embeddings and the LM head beside the adapters.
    #[arg(long)]
    pub train_embeddings: bool,
    /// After training, write the adapters as PEFT writes them to this folder
    /// (adapter_model.safetensors and adapter_config.json), which PEFT's
    /// `PeftModel.from_pretrained(base, folder)` loads.
    #[arg(long)]
    pub export_peft: Option<PathBuf>,
    /// With --export-hf: fold the adapters into the weights (W + scale·B·A)
    /// and write the whole model, its base as the engine held it (with
    /// --base-dtype bf16, rounded to bf16: lossless for a bf16 checkpoint).
    #[arg(long)]
    pub merge_lora: bool,
    /// How the offload engine holds the frozen base in host memory: f32,
    /// bf16 (2 bytes a parameter), int8 (about 1: an absmax per output
    /// channel) or nf4 (about 0.52: QLoRA's 4-bit NormalFloat with
    /// double-quantised block scales), the blocks' weight matrices
    /// dequantised on the GPU as each block arrives (norms, embeddings and
    /// head stay bf16). Default: the compute precision (f32, or bf16).
    #[arg(long, value_parser = parse_base_dtype)]
    pub base_dtype: Option<FrozenDtype>,
}

/// `f32`, or a base format's name.
fn parse_base_dtype(s: &str) -> Result<FrozenDtype, QuantError> {
    if s.trim().eq_ignore_ascii_case("f32") {
        return Ok(FrozenDtype::F32);
    }
    s.parse::<BaseDtype>().map(FrozenDtype::Base)
}

impl LoraOptions {
    /// Whether the run trains adapters.
    pub fn enabled(&self) -> bool {
        self.lora_rank > 0
    }
}

/// LoRA options refused before anything is read, each naming its flag.
#[derive(Debug, thiserror::Error)]
pub enum LoraOptionsError {
    #[error("{0} applies to LoRA adapters; add --lora-rank")]
    NeedsRank(&'static str),
    #[error("--lora-alpha must be a positive number, got {0}")]
    Alpha(f64),
    #[error("--lora-dropout must be in [0, 1), got {0}")]
    Dropout(f64),
    #[error(
        "--lora-dropout needs --resident: the offload engine recomputes each block in the \
         backward, and a dropout mask drawn again would not be the forward's"
    )]
    DropoutStreamed,
    #[error(
        "--base-dtype sets how the offload engine holds the frozen base; --resident keeps the \
         model on the GPU as it is (drop one)"
    )]
    BaseDtypeResident,
    #[error(
        "--export-hf of a LoRA run writes the merged model; add --merge-lora (or write the \
         adapters alone with --export-peft)"
    )]
    ExportWithoutMerge,
    #[error("--merge-lora folds the adapters into --export-hf's model; add --export-hf")]
    MergeWithoutExport,
    #[error(
        "--merge-lora with --base-dtype {0} would write the dequantised base; write the adapters \
         with --export-peft and merge them into the original model (`chat --adapter` loads them \
         onto it)"
    )]
    MergeQuantised(&'static str),
}

/// The rules of the LoRA options: what needs `--lora-rank`, the values,
/// and how they go with the rest (`resident`, `export_hf`: whether those are
/// asked).
pub fn validate(
    lora: &LoraOptions,
    given: impl Fn(&str) -> bool,
    resident: bool,
    export_hf: bool,
) -> Result<(), LoraOptionsError> {
    use LoraOptionsError as E;
    if !lora.enabled() {
        let set = [
            ("--lora-alpha", given("lora_alpha")),
            ("--lora-dropout", given("lora_dropout")),
            ("--lora-targets", !lora.lora_targets.is_empty()),
            ("--rslora", lora.rslora),
            ("--train-embeddings", lora.train_embeddings),
            ("--export-peft", lora.export_peft.is_some()),
            ("--merge-lora", lora.merge_lora),
            ("--base-dtype", lora.base_dtype.is_some()),
        ];
        if let Some((flag, _)) = set.iter().find(|(_, set)| *set) {
            return Err(E::NeedsRank(flag));
        }
        return Ok(());
    }
    if !(lora.lora_alpha.is_finite() && lora.lora_alpha > 0.0) {
        return Err(E::Alpha(lora.lora_alpha));
    }
    if !(lora.lora_dropout.is_finite() && (0.0..1.0).contains(&lora.lora_dropout)) {
        return Err(E::Dropout(lora.lora_dropout));
    }
    if !resident && lora.lora_dropout > 0.0 {
        return Err(E::DropoutStreamed);
    }
    if resident && lora.base_dtype.is_some() {
        return Err(E::BaseDtypeResident);
    }
    if let Some(FrozenDtype::Base(base @ (BaseDtype::Int8 | BaseDtype::Nf4))) = lora.base_dtype {
        if lora.merge_lora {
            return Err(E::MergeQuantised(base.name()));
        }
    }
    match (export_hf, lora.merge_lora) {
        (true, false) => Err(E::ExportWithoutMerge),
        (false, true) => Err(E::MergeWithoutExport),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lora: LoraOptions,
        #[arg(long)]
        resident: bool,
        #[arg(long)]
        export_hf: Option<PathBuf>,
    }

    fn check(args: &[&str]) -> Result<(), LoraOptionsError> {
        let matches = <Cli as clap::CommandFactory>::command()
            .try_get_matches_from(std::iter::once("train").chain(args.iter().copied()))
            .unwrap();
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        let given =
            |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        validate(&cli.lora, given, cli.resident, cli.export_hf.is_some())
    }

    #[test]
    fn lora_flags_without_a_rank_are_refused() {
        for (args, flag) in [
            (&["--lora-alpha", "16"][..], "--lora-alpha"),
            (&["--lora-dropout", "0.1"], "--lora-dropout"),
            (&["--lora-targets", "q_proj"], "--lora-targets"),
            (&["--rslora"], "--rslora"),
            (&["--train-embeddings"], "--train-embeddings"),
            (&["--export-peft", "out"], "--export-peft"),
            (&["--merge-lora"], "--merge-lora"),
            (&["--base-dtype", "nf4"], "--base-dtype"),
        ] {
            let error = check(args).unwrap_err().to_string();
            assert!(error.starts_with(flag), "{args:?}: {error}");
        }
        check(&[]).unwrap();
    }

    #[test]
    fn lora_values_and_companions_are_checked() {
        let rank = ["--resident", "--lora-rank", "8"];
        let with = |more: &[&'static str]| [&rank[..], more].concat();
        check(&rank).unwrap();
        check(&with(&[
            "--export-peft",
            "a",
            "--export-hf",
            "b",
            "--merge-lora",
        ]))
        .unwrap();
        assert!(matches!(
            check(&with(&["--lora-alpha", "0"])),
            Err(LoraOptionsError::Alpha(_))
        ));
        assert!(matches!(
            check(&with(&["--lora-dropout", "1"])),
            Err(LoraOptionsError::Dropout(_))
        ));
        assert!(matches!(
            check(&with(&["--export-hf", "b"])),
            Err(LoraOptionsError::ExportWithoutMerge)
        ));
        assert!(matches!(
            check(&with(&["--merge-lora"])),
            Err(LoraOptionsError::MergeWithoutExport)
        ));
        check(&["--lora-rank", "8", "--base-dtype", "nf4"]).unwrap();
        assert!(matches!(
            check(&["--lora-rank", "8", "--lora-dropout", "0.1"]),
            Err(LoraOptionsError::DropoutStreamed)
        ));
        assert!(matches!(
            check(&with(&["--base-dtype", "int8"])),
            Err(LoraOptionsError::BaseDtypeResident)
        ));
        assert!(
            <Cli as clap::Parser>::try_parse_from(["train", "--base-dtype", "fp8"]).is_err(),
            "an unknown base dtype parses"
        );
    }
}
