//! The matmul kernels `Gemm<Cuda>` can launch: cubek's strategies, the ones
//! burn's autotuner tries (burn-cubecl 0.21, `kernel/matmul/tune/base.rs`).
//!
//! A strategy that cannot run a case (unsupported layout or dtype, or a launch
//! error) falls back to burn's own matmul for that call, so a choice can make
//! a matmul slower but never wrong. Which one is fastest depends on shape and
//! dtype: `bench/gpu/gemm.sh` times them all (run13: on the 0.85B block's
//! bf16 shapes `auto` ran 82–94 TFLOPS, `simple_tma_mma` and
//! `specialized_tma_mma` 188–217).

use std::any::{Any, TypeId};
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, RwLock};

use burn::tensor::backend::Backend;
use burn::tensor::DType;
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use cubek::matmul::components::tile::TileMatmulKind;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::matmul::routines::{
    double_buffering::DoubleBufferingArgs, double_unit::DoubleUnitSelectionArgs,
    ordered_double_buffering::OrderedSelectionArgs, simple::SimpleArgs,
    simple_unit::SimpleUnitSelectionArgs, BlueprintStrategy, TileSizeSelection,
};
use cubek::std::InputBinding;

use crate::cuda::CudaBackend;

/// Every strategy by the name `Strategy`'s `Display` gives it (`auto` is
/// burn's default, also reachable as the name `auto` of `set_matmul`).
pub fn matmul_strategies() -> Vec<Strategy> {
    let simple = |multi_rows, tile_matmul| SimpleArgs {
        multi_rows,
        tile_matmul,
    };
    let ordered = |row_count, tile_matmul| OrderedSelectionArgs {
        partition_k: Some(2),
        row_count: Some(row_count),
        rows_per_plane: Some(2),
        tile_matmul,
    };
    let double = |specialized, tile_matmul| DoubleBufferingArgs {
        specialized,
        tile_matmul,
    };
    use BlueprintStrategy::Inferred;
    use TileMatmulKind::{Cmma, Mma};
    vec![
        Strategy::SimpleUnit(Inferred(SimpleUnitSelectionArgs {
            tile_size: TileSizeSelection::MaxTileSize,
        })),
        Strategy::DoubleUnit(Inferred(DoubleUnitSelectionArgs {
            tile_size: TileSizeSelection::MaxTileSize,
        })),
        Strategy::SimpleCyclicCmma(Inferred(simple(false, Cmma))),
        Strategy::SimpleCyclicMma(Inferred(simple(false, Mma))),
        Strategy::SimpleCyclicCmma(Inferred(simple(true, Cmma))),
        Strategy::SimpleCyclicMma(Inferred(simple(true, Mma))),
        Strategy::OrderedDoubleCmma(Inferred(ordered(4, Cmma))),
        Strategy::OrderedDoubleMma(Inferred(ordered(4, Mma))),
        Strategy::OrderedDoubleCmma(Inferred(ordered(8, Cmma))),
        Strategy::OrderedDoubleMma(Inferred(ordered(8, Mma))),
        Strategy::DoubleCyclicCmma(Inferred(double(false, Cmma))),
        Strategy::DoubleCyclicMma(Inferred(double(false, Mma))),
        Strategy::DoubleCyclicCmma(Inferred(double(true, Cmma))),
        Strategy::DoubleCyclicMma(Inferred(double(true, Mma))),
        Strategy::SpecializedCyclicCmma(Inferred(().into())),
        Strategy::SpecializedCyclicMma(Inferred(().into())),
        Strategy::SimpleTmaCmma(Inferred(simple(false, Cmma))),
        Strategy::SimpleTmaMma(Inferred(simple(false, Mma))),
        Strategy::SimpleTmaCmma(Inferred(simple(true, Cmma))),
        Strategy::SimpleTmaMma(Inferred(simple(true, Mma))),
        Strategy::SpecializedTmaCmma(Inferred(().into())),
        Strategy::SpecializedTmaMma(Inferred(().into())),
    ]
}

/// The strategy `Gemm<Cuda>` launches; `None`: burn's own matmul.
static SELECTED: RwLock<Option<Strategy>> = RwLock::new(None);

/// Cases the selected strategy could not run, so that each is tried (and its
/// setup error paid) once: shapes, strides and dtype of both operands.
static DECLINED: Mutex<Option<HashSet<CaseKey>>> = Mutex::new(None);

type CaseKey = (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>, DType);

fn case_key(lhs: &CubeTensor<CudaRuntime>, rhs: &CubeTensor<CudaRuntime>) -> CaseKey {
    (
        lhs.meta.shape().to_vec(),
        lhs.meta.strides().to_vec(),
        rhs.meta.shape().to_vec(),
        rhs.meta.strides().to_vec(),
        lhs.dtype,
    )
}

/// Selects a strategy by name (`None`: burn's own).
pub(crate) fn select_matmul(name: Option<&str>) -> Result<(), String> {
    let strategy = match name {
        None => None,
        Some(name) => {
            let all = matmul_strategies();
            let names: Vec<String> = all.iter().map(|s| s.to_string()).collect();
            let Some(i) = names.iter().position(|n| n == name) else {
                return Err(format!(
                    "unknown matmul kernel `{name}`; one of: auto, {}",
                    names.join(", ")
                ));
            };
            Some(all.into_iter().nth(i).expect("index from the same list"))
        }
    };
    *SELECTED.write().expect("matmul selection lock") = strategy;
    *DECLINED.lock().expect("declined cases lock") = None;
    Ok(())
}

/// `lhs @ rhs` with the selected strategy when `B` is burn's CUDA backend, a
/// strategy is selected and it runs this case; otherwise the operands back.
pub(crate) fn matmul_selected<B: Backend>(
    lhs: B::FloatTensorPrimitive,
    rhs: B::FloatTensorPrimitive,
) -> Result<B::FloatTensorPrimitive, (B::FloatTensorPrimitive, B::FloatTensorPrimitive)> {
    if TypeId::of::<B>() != TypeId::of::<CudaBackend>() {
        return Err((lhs, rhs));
    }
    let selected = SELECTED.read().expect("matmul selection lock");
    let Some(strategy) = selected.as_ref() else {
        return Err((lhs, rhs));
    };
    let (Some(l), Some(r)) = (
        (&lhs as &dyn Any).downcast_ref::<CubeTensor<CudaRuntime>>(),
        (&rhs as &dyn Any).downcast_ref::<CubeTensor<CudaRuntime>>(),
    ) else {
        return Err((lhs, rhs));
    };
    let key = case_key(l, r);
    let mut declined = DECLINED.lock().expect("declined cases lock");
    if declined.as_ref().is_some_and(|d| d.contains(&key)) {
        return Err((lhs, rhs));
    }
    match launch(strategy, l, r) {
        None => {
            declined.get_or_insert_with(HashSet::new).insert(key);
            Err((lhs, rhs))
        }
        Some(out) => {
            let boxed: Box<dyn Any> = Box::new(out);
            Ok(*boxed
                .downcast::<B::FloatTensorPrimitive>()
                .expect("B is the CUDA backend"))
        }
    }
}

/// What burn-cubecl's `float_matmul` does, with `strategy` in place of its
/// default; `None` where the strategy does not run this case.
fn launch(
    strategy: &Strategy,
    lhs: &CubeTensor<CudaRuntime>,
    rhs: &CubeTensor<CudaRuntime>,
) -> Option<CubeTensor<CudaRuntime>> {
    let dtype = lhs.dtype;
    if rhs.dtype != dtype
        || !matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
        || lhs.qparams.is_some()
        || rhs.qparams.is_some()
    {
        return None;
    }
    let out = init_matmul_output(lhs, rhs, dtype);
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: dtype.into(),
        rhs: dtype.into(),
        out: dtype.into(),
    });
    // A strategy's setup reports cases it cannot run as errors, but some
    // checks are assertions: either way, burn's own matmul takes the case.
    let launched = catch_unwind(AssertUnwindSafe(|| {
        launch_ref(
            strategy,
            &out.client,
            InputBinding::new(lhs.clone().binding(), dtype.into()),
            InputBinding::new(rhs.clone().binding(), dtype.into()),
            out.clone().binding(),
            &mut dtypes,
        )
    }));
    matches!(launched, Ok(Ok(()))).then_some(out)
}
