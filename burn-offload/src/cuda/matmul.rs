//! The matmul kernels `Gemm<Cuda>` can launch: cubek's strategies, the ones
//! burn's autotuner tries (burn-cubecl 0.21, `kernel/matmul/tune/base.rs`),
//! and cuBLAS (`cublas`, through cudarc; libcublas is loaded at run time).
//!
//! A strategy that cannot run a case (unsupported layout or dtype, or a launch
//! error) falls back to burn's own matmul for that call, so a choice can make
//! a matmul slower but never wrong. Which one is fastest depends on shape and
//! dtype: `bench/gpu/gemm.sh` times them all (on the 0.85B block's
//! bf16 shapes `auto` ran 82–94 TFLOPS, `simple_tma_mma` and
//! `specialized_tma_mma` 188–217, cuBLAS through PyTorch 735–803).
//!
//! cuBLAS runs on cubecl's own stream, which cubecl 0.10 keeps private: the
//! vendored cubecl-cuda (vendor/cubecl-cuda/PATCH.md) hands it out with a
//! buffer's device address, so no cuBLAS matmul is fenced on the host (wait
//! for cubecl's queue, run on a stream of our own, wait for that), which
//! left the GPU idle while the host queued the next kernels.

use std::any::{Any, TypeId};
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Instant;

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

use super::types::CudaBackend;
use crate::backend::{GemmKernels, MatmulError};

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

/// A matmul kernel other than burn's own.
enum Kernel {
    Cubek(Strategy),
    /// With `tf32`, f32 in TF32 tensor-core math; else full f32.
    Cublas {
        tf32: bool,
    },
    /// `fast`: the kernel that measured fastest for each dtype on the H100.
    Fast(Box<FastKernels>),
}

/// What `fast` launches: cuBLAS when libcublas can be loaded, f32 in TF32
/// tensor-core math (the precision burn's own f32 matmul computes in: cubek
/// stages f32 as tf32) and bf16/f16 with f32 accumulation. On the H100 it ran
/// the 0.85B engine at 16k tokens 1.65× faster in fp32 than cubek's fastest
/// f32 strategy, and at 64k tokens in bf16 1.38× faster than when each cuBLAS
/// call was fenced on the host. Without libcublas, cubek's
/// tensor-core strategies: for f32 `specialized_tma_mma`, then
/// `simple_cyclic_mma_multi_rows` for layouts TMA cannot load (1.3× `auto`);
/// for bf16/f16 `simple_tma_mma`.
// Held boxed (`Kernel::Fast`), once per process: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum FastKernels {
    Cublas,
    Cubek { f32: [Strategy; 2], half: Strategy },
}

/// The name `set_matmul` takes for the per-dtype choice.
pub const FAST: &str = "fast";

/// The strategy of [`matmul_strategies`] that `Display`s as `name`.
fn strategy_named(name: &str) -> Option<Strategy> {
    matmul_strategies()
        .into_iter()
        .find(|s| s.to_string() == name)
}

fn cublas_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// The kernel `Gemm<Cuda>` launches; `None`: burn's own matmul.
static SELECTED: RwLock<Option<Kernel>> = RwLock::new(None);

/// The name `set_matmul` takes for cuBLAS (f32 in full f32 math).
pub const CUBLAS: &str = "cublas";

/// The name `set_matmul` takes for cuBLAS with f32 in TF32 tensor-core math
/// (the precision cubek's f32 strategies, burn's default included, compute in).
pub const CUBLAS_TF32: &str = "cublas-tf32";

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

/// Matmuls the selected kernel ran, matmuls it left to burn's, and the host
/// time spent in its calls (launches only: nothing waits on the host), since
/// the kernel was selected.
static LAUNCHED: AtomicU64 = AtomicU64::new(0);
static FELL_BACK: AtomicU64 = AtomicU64::new(0);
static CALL_NANOS: AtomicU64 = AtomicU64::new(0);

/// What the selected kernel did since `crate::set_matmul`: how many
/// matmuls it ran, how many went to burn's matmul and why (the cases it
/// declined: operand shapes, strides and dtype).
#[derive(Debug, Clone, Default)]
pub struct MatmulStats {
    /// Matmuls the selected kernel ran.
    pub launched: u64,
    /// Matmuls that went to burn's own.
    pub fell_back: u64,
    /// Host seconds inside the selected kernel's calls (launches only).
    pub call_s: f64,
    /// The cases the kernel declined.
    pub declined: Vec<String>,
}

/// The counters of the selected matmul kernel (zero under `auto`).
pub fn matmul_stats() -> MatmulStats {
    let declined = DECLINED.lock().expect("declined cases lock");
    let mut cases: Vec<String> = declined
        .iter()
        .flatten()
        .map(|(ls, lst, rs, rst, dtype)| {
            format!("lhs {ls:?} strides {lst:?}, rhs {rs:?} strides {rst:?}, {dtype:?}")
        })
        .collect();
    cases.sort();
    MatmulStats {
        launched: LAUNCHED.load(Ordering::Relaxed),
        fell_back: FELL_BACK.load(Ordering::Relaxed),
        call_s: CALL_NANOS.load(Ordering::Relaxed) as f64 * 1e-9,
        declined: cases,
    }
}

/// Selects a strategy by name (`None`: burn's own).
pub(crate) fn select_matmul(name: Option<&str>) -> Result<(), MatmulError> {
    let kernel = match name {
        None => None,
        Some(FAST) => {
            let named = |name| strategy_named(name).expect("a name from matmul_strategies()");
            Some(Kernel::Fast(Box::new(if cublas_present() {
                FastKernels::Cublas
            } else {
                FastKernels::Cubek {
                    f32: [
                        named("matmul_specialized_tma_mma"),
                        named("matmul_simple_cyclic_mma_multi_rows"),
                    ],
                    half: named("matmul_simple_tma_mma"),
                }
            })))
        }
        Some(name @ (CUBLAS | CUBLAS_TF32)) => {
            if !cublas_present() {
                return Err(MatmulError::NoCublas(name.to_string()));
            }
            Some(Kernel::Cublas {
                tf32: name == CUBLAS_TF32,
            })
        }
        Some(name) => match strategy_named(name) {
            Some(strategy) => Some(Kernel::Cubek(strategy)),
            None => {
                return Err(MatmulError::Unknown {
                    name: name.to_string(),
                    known: kernel_names(),
                });
            }
        },
    };
    *SELECTED.write().expect("matmul selection lock") = kernel;
    *DECLINED.lock().expect("declined cases lock") = None;
    for counter in [&LAUNCHED, &FELL_BACK, &CALL_NANOS] {
        counter.store(0, Ordering::Relaxed);
    }
    Ok(())
}

/// Every name `select_matmul` takes, `auto` first.
pub(crate) fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = ["auto", FAST, CUBLAS, CUBLAS_TF32]
        .iter()
        .map(|s| s.to_string())
        .collect();
    names.extend(matmul_strategies().iter().map(|s| s.to_string()));
    names
}

/// Burn's CUDA backend launches the kernel `select_matmul` chose.
impl GemmKernels for CudaBackend {
    fn matmul(
        lhs: Self::FloatTensorPrimitive,
        rhs: Self::FloatTensorPrimitive,
    ) -> Result<Self::FloatTensorPrimitive, (Self::FloatTensorPrimitive, Self::FloatTensorPrimitive)>
    {
        matmul_selected::<Self>(lhs, rhs)
    }

    fn kernel_chosen() -> bool {
        selected_for::<Self>()
    }
}

/// Whether `B`'s matmuls go to a chosen kernel: `B` is burn's CUDA backend
/// and a kernel other than `auto` is selected.
pub(crate) fn selected_for<B: Backend>() -> bool {
    TypeId::of::<B>() == TypeId::of::<CudaBackend>()
        && SELECTED.read().expect("matmul selection lock").is_some()
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
    let Some(kernel) = selected.as_ref() else {
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
        FELL_BACK.fetch_add(1, Ordering::Relaxed);
        return Err((lhs, rhs));
    }
    let start = Instant::now();
    let out = match kernel {
        Kernel::Cubek(strategy) => launch(strategy, l, r),
        Kernel::Cublas { tf32 } => cublas::matmul(l, r, *tf32),
        Kernel::Fast(fast) => match (fast.as_ref(), l.dtype) {
            (FastKernels::Cublas, _) => cublas::matmul(l, r, true),
            (FastKernels::Cubek { f32, .. }, DType::F32) => {
                f32.iter().find_map(|s| launch(s, l, r))
            }
            (FastKernels::Cubek { half, .. }, _) => launch(half, l, r),
        },
    };
    CALL_NANOS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    match out {
        None => {
            FELL_BACK.fetch_add(1, Ordering::Relaxed);
            declined.get_or_insert_with(HashSet::new).insert(key);
            Err((lhs, rhs))
        }
        Some(out) => {
            LAUNCHED.fetch_add(1, Ordering::Relaxed);
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

/// `lhs @ rhs` through cuBLAS on cubecl's stream (the module comment), f32 in
/// TF32 tensor-core math with `tf32` (as `cublas-tf32` launches it) and in
/// full f32 without (`cublas`); `None` when cuBLAS cannot take the operands'
/// dtype or layout, or fails. For `gemm_bench`, which times it beside
/// cubek's strategies.
pub fn cublas_matmul(
    lhs: &CubeTensor<CudaRuntime>,
    rhs: &CubeTensor<CudaRuntime>,
    tf32: bool,
) -> Option<CubeTensor<CudaRuntime>> {
    cublas::matmul(lhs, rhs, tf32)
}

/// `lhs @ rhs` through cuBLAS (`cublasGemmStridedBatchedEx`, fp32 accumulation).
mod cublas {
    use std::cell::RefCell;
    use std::ffi::{c_int, c_longlong, c_void};

    use burn::tensor::DType;
    use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
    use burn_cubecl::kernel::matmul::init_matmul_output;
    use burn_cubecl::tensor::CubeTensor;
    use cudarc::cublas::{result, sys};
    use cudarc::driver::sys as driver;

    use super::super::copier::{bind_context, device_ptr_and_stream};

    /// One operand as cuBLAS reads it: its matrices' layout and, per batch
    /// dim of the output, the stride between its matrices (0: broadcast).
    #[derive(Debug, Clone, PartialEq)]
    pub(super) struct Operand {
        /// Stored transposed relative to row-major (a `swap_dims` view).
        pub transposed: bool,
        /// Leading dimension: the stride between rows (or, transposed, columns).
        pub ld: usize,
        pub batch_strides: Vec<usize>,
    }

    /// How a `[.., rows, cols]` tensor with `strides` is laid out for cuBLAS,
    /// given the output's batch shape; `None` when its matrices do not have
    /// unit stride along rows or columns, or a batch dim neither matches the
    /// output's nor broadcasts.
    pub(super) fn operand(shape: &[usize], strides: &[usize], batch: &[usize]) -> Option<Operand> {
        let r = shape.len();
        if r < 2 || strides.len() != r || batch.len() != r - 2 {
            return None;
        }
        let (rows, cols) = (shape[r - 2], shape[r - 1]);
        let (sr, sc) = (strides[r - 2], strides[r - 1]);
        let (transposed, ld) = if sc == 1 && sr >= cols.max(1) {
            (false, sr)
        } else if sr == 1 && sc >= rows.max(1) {
            (true, sc)
        } else if rows == 1 && sc == 1 {
            (false, cols.max(1))
        } else if cols == 1 && sr == 1 {
            (true, rows.max(1))
        } else {
            return None;
        };
        let batch_strides = (0..r - 2)
            .map(|i| match (shape[i], batch[i]) {
                (1, _) => Some(0),
                (d, b) if d == b => Some(strides[i]),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Operand {
            transposed,
            ld,
            batch_strides,
        })
    }

    /// A batch of matmuls as cuBLAS calls: each call covers `count` matrices
    /// spaced by `strides` (A, B, C, in elements), starting at one entry of
    /// `offsets`. Batch dims that one stride walks share a call; the others
    /// (e.g. heads of a `[b, s, h, d]` buffer viewed as `[b, h, s, d]`)
    /// become a loop of calls.
    #[derive(Debug, PartialEq)]
    pub(super) struct BatchPlan {
        pub count: usize,
        pub strides: [usize; 3],
        pub offsets: Vec<[usize; 3]>,
    }

    /// `batch`: the output's batch shape; `dims[k][i]`: operand k's stride
    /// along batch dim i (A, B, then C).
    pub(super) fn batch_plan(batch: &[usize], dims: [&[usize]; 3]) -> BatchPlan {
        let live: Vec<usize> = (0..batch.len()).filter(|&i| batch[i] != 1).collect();
        let Some((&inner, outer)) = live.split_last() else {
            return BatchPlan {
                count: 1,
                strides: [0; 3],
                offsets: vec![[0; 3]],
            };
        };
        let strides = dims.map(|d| d[inner]);
        let mut count = batch[inner];
        let mut rest = outer;
        while let Some((&i, more)) = rest.split_last() {
            if (0..3).all(|k| dims[k][i] == strides[k] * count) {
                count *= batch[i];
                rest = more;
            } else {
                break;
            }
        }
        let mut offsets = vec![[0usize; 3]];
        for &i in rest {
            offsets = offsets
                .iter()
                .flat_map(|o| {
                    (0..batch[i]).map(move |j| {
                        [
                            o[0] + j * dims[0][i],
                            o[1] + j * dims[1][i],
                            o[2] + j * dims[2][i],
                        ]
                    })
                })
                .collect();
        }
        BatchPlan {
            count,
            strides,
            offsets,
        }
    }

    /// A cuBLAS handle per thread and device, and the stream it was last set to.
    struct Blas {
        handle: sys::cublasHandle_t,
        stream: driver::CUstream,
    }

    thread_local! {
        /// By device index: a handle belongs to the context it was made in.
        static BLAS: RefCell<Vec<Option<Blas>>> = const { RefCell::new(Vec::new()) };
    }

    /// Runs `f` with this thread's handle set to `stream`; `None` when cuBLAS
    /// cannot be initialised or take the stream.
    fn with_blas<R>(
        device: &CudaDevice,
        stream: driver::CUstream,
        f: impl FnOnce(sys::cublasHandle_t) -> R,
    ) -> Option<R> {
        bind_context(device);
        BLAS.with(|cell| {
            let mut handles = cell.borrow_mut();
            if handles.len() <= device.index {
                handles.resize_with(device.index + 1, || None);
            }
            let slot = &mut handles[device.index];
            if slot.is_none() {
                // The primary context is current (cuBLAS binds the handle to it).
                let handle = result::create_handle().ok()?;
                *slot = Some(Blas {
                    handle,
                    stream: std::ptr::null_mut(),
                });
            }
            let blas = slot.as_mut().expect("just set");
            if blas.stream != stream {
                // SAFETY: a live handle and a live stream of this context.
                unsafe { result::set_stream(blas.handle, stream.cast()) }.ok()?;
                blas.stream = stream;
            }
            Some(f(blas.handle))
        })
    }

    /// With `tf32`, f32 operands are multiplied as tf32 on the tensor cores
    /// (f32 accumulation); other dtypes are unaffected.
    pub(super) fn matmul(
        lhs: &CubeTensor<CudaRuntime>,
        rhs: &CubeTensor<CudaRuntime>,
        tf32: bool,
    ) -> Option<CubeTensor<CudaRuntime>> {
        let dtype = lhs.dtype;
        let compute = if tf32 && dtype == DType::F32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let data_type = match dtype {
            DType::F32 => sys::cudaDataType::CUDA_R_32F,
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            DType::F16 => sys::cudaDataType::CUDA_R_16F,
            _ => return None,
        };
        if rhs.dtype != dtype || lhs.qparams.is_some() || rhs.qparams.is_some() {
            return None;
        }
        let out = init_matmul_output(lhs, rhs, dtype);
        let out_shape = out.meta.shape().to_vec();
        let r = out_shape.len();
        let batch_dims = &out_shape[..r - 2];
        let a = operand(lhs.meta.shape(), lhs.meta.strides(), batch_dims)?;
        let b = operand(rhs.meta.shape(), rhs.meta.strides(), batch_dims)?;
        // The output's rows may be padded: cubecl may pitch a buffer whose
        // rows miss its alignment (assuming a contiguous bf16 [.., 80]
        // attention output made the loss NaN), so its strides are
        // read, not assumed from its shape.
        let c = operand(&out_shape, out.meta.strides(), batch_dims).filter(|c| !c.transposed)?;
        let (m, n) = (out_shape[r - 2], out_shape[r - 1]);
        let k = lhs.meta.shape()[r - 1];
        let plan = batch_plan(
            batch_dims,
            [&a.batch_strides, &b.batch_strides, &c.batch_strides],
        );
        let int = |x: usize| c_int::try_from(x).ok();
        let (mi, ni, ki, bi) = (int(m)?, int(n)?, int(k)?, int(plan.count)?);
        let (lda, ldb, ldc) = (int(a.ld)?, int(b.ld)?, int(c.ld)?);
        if m == 0 || n == 0 || plan.offsets.is_empty() {
            return Some(out);
        }
        let elem = dtype.size() as u64;
        let device = lhs.device.clone();
        // Each lookup orders this thread's cubecl stream behind the buffer's
        // writers and names that stream: queued there, the matmul runs after
        // the kernels that produce its operands and before those that read
        // its output, with no host wait.
        let (pa, stream) = device_ptr_and_stream(lhs);
        let (pb, _) = device_ptr_and_stream(rhs);
        let (pc, out_stream) = device_ptr_and_stream(&out);
        if stream.is_null() || stream != out_stream {
            return None;
        }
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ok = with_blas(&device, stream, |handle| {
            // Row-major C[m,n] = A[m,k]·B[k,n] is column-major Cᵀ[n,m] = Bᵀ·Aᵀ,
            // and a row-major matrix read column-major is its transpose: so
            // cuBLAS gets B first, each operand transposed iff it is stored
            // transposed.
            // SAFETY: the pointers address live buffers of the layouts just
            // checked (the tensors are held by the caller, `out` by us), at
            // offsets within their batch; cubecl frees and reuses buffers in
            // the order of this stream, after the matmul has run.
            unsafe {
                for [oa, ob, oc] in &plan.offsets {
                    let status = result::gemm_strided_batched_ex(
                        handle,
                        op(b.transposed),
                        op(a.transposed),
                        ni,
                        mi,
                        ki,
                        (&alpha as *const f32).cast::<c_void>(),
                        (pb + *ob as u64 * elem) as *const c_void,
                        data_type,
                        ldb,
                        plan.strides[1] as c_longlong,
                        (pa + *oa as u64 * elem) as *const c_void,
                        data_type,
                        lda,
                        plan.strides[0] as c_longlong,
                        (&beta as *const f32).cast::<c_void>(),
                        (pc + *oc as u64 * elem) as *mut c_void,
                        data_type,
                        ldc,
                        plan.strides[2] as c_longlong,
                        bi,
                        compute,
                        sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                    );
                    if status.is_err() {
                        return false;
                    }
                }
                true
            }
        });
        (ok == Some(true)).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::cublas::{batch_plan, operand, BatchPlan, Operand};

    #[test]
    fn operand_layouts_for_cublas() {
        let op = |transposed, ld, batch_strides: &[usize]| {
            Some(Operand {
                transposed,
                ld,
                batch_strides: batch_strides.to_vec(),
            })
        };
        // Row-major [4, 3], and its swap_dims view of a [3, 4] buffer.
        assert_eq!(operand(&[4, 3], &[3, 1], &[]), op(false, 3, &[]));
        assert_eq!(operand(&[4, 3], &[1, 4], &[]), op(true, 4, &[]));
        // A batch [2, 5] of [4, 3] matrices, contiguous; and broadcast.
        assert_eq!(
            operand(&[2, 5, 4, 3], &[60, 12, 3, 1], &[2, 5]),
            op(false, 3, &[60, 12])
        );
        assert_eq!(
            operand(&[1, 1, 4, 3], &[12, 12, 3, 1], &[2, 5]),
            op(false, 3, &[0, 0])
        );
        // Heads of a [b, s, h, d] buffer viewed as [b, h, s, d].
        assert_eq!(
            operand(&[2, 4, 8, 16], &[512, 16, 64, 1], &[2, 4]),
            op(false, 64, &[512, 16])
        );
        // A batch dim that neither matches nor broadcasts; neither rows nor
        // columns contiguous.
        assert_eq!(operand(&[3, 5, 4, 3], &[60, 12, 3, 1], &[2, 5]), None);
        assert_eq!(operand(&[4, 3], &[6, 2], &[]), None);
    }

    #[test]
    fn batch_plans_merge_what_one_stride_walks() {
        // No batch, or only size-1 dims: one call of one matrix.
        let single = BatchPlan {
            count: 1,
            strides: [0; 3],
            offsets: vec![[0; 3]],
        };
        assert_eq!(batch_plan(&[], [&[], &[], &[]]), single);
        assert_eq!(batch_plan(&[1, 1], [&[9, 9], &[0, 0], &[6, 6]]), single);
        // Contiguous [2, 5] batch, B broadcast: one call of 10.
        assert_eq!(
            batch_plan(&[2, 5], [&[60, 12], &[0, 0], &[30, 6]]),
            BatchPlan {
                count: 10,
                strides: [12, 0, 6],
                offsets: vec![[0; 3]],
            }
        );
        // A's heads interleaved ([b, s, h, d] as [b, h, s, d]): a call per b.
        assert_eq!(
            batch_plan(&[2, 4], [&[512, 16], &[128, 32], &[96, 24]]),
            BatchPlan {
                count: 4,
                strides: [16, 32, 24],
                offsets: vec![[0, 0, 0], [512, 128, 96]],
            }
        );
    }
}
