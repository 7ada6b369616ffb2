//! [`crate::host::lookup`]'s device sums as a CubeCL kernel on burn's CUDA backend:
//! a cube per segment and block of columns, a unit per column summing the
//! segment's positions of `dy` in order, in f32 (adjacent units read adjacent
//! columns of a position's row).

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Shape, Tensor, TensorData};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use cubecl::{CubeCount, CubeDim};

use crate::cuda::{as_float, float_cube, int_cube, is_float};
use crate::host::lookup::TokenRows;

/// The kernels, apart: cubecl's prelude has a `Tensor` of its own.
mod kernels {
    use cubecl::prelude::*;

    #[cube(launch)]
    pub(super) fn segment_sums_kernel<F: Float>(
        dy: &Tensor<F>,
        order: &Tensor<i32>,
        starts: &Tensor<i32>,
        sums: &mut Tensor<f32>,
        width: u32,
        column_blocks: u32,
        #[define(F)] _dtype: StorageType,
    ) {
        let segment = (CUBE_POS_X / column_blocks) as usize;
        let col = ((CUBE_POS_X % column_blocks) * CUBE_DIM_X + UNIT_POS_X) as usize;
        let n = width as usize;
        if col >= n {
            terminate!();
        }
        let mut k = starts[segment] as usize;
        let end = starts[segment + 1] as usize;
        let mut sum = f32::new(0.0);
        while k < end {
            sum += f32::cast_from(dy[order[k] as usize * n + col]);
            k += 1;
        }
        sums[segment * n + col] = sum;
    }
}
use kernels::segment_sums_kernel;

/// Columns per cube.
const COLUMNS: u32 = 256;

/// The segment sums of `dy` (`[batch, seq, width]`, the embedding's output
/// gradient) for `rows`, f32 `[segments, width]`; `None` off CUDA.
pub(crate) fn segment_sums<B: Backend>(
    dy: &Tensor<B, 3>,
    rows: &TokenRows,
) -> Option<Tensor<B, 2>> {
    let d = float_cube(dy)?;
    if !is_float(d.dtype) {
        return None;
    }
    let width = dy.dims()[2];
    let device = dy.device();
    let ints = |v: &[i32]| {
        let t = Tensor::<B, 1, Int>::from_data(TensorData::new(v.to_vec(), [v.len()]), &device);
        int_cube(&t).filter(|c| c.dtype == DType::I32)
    };
    let (order, starts) = (ints(&rows.order)?, ints(&rows.starts)?);
    let d = into_contiguous(d);
    let segments = rows.segments();
    let sums = empty_device_contiguous_dtype(
        d.client.clone(),
        d.device.clone(),
        Shape::new([segments, width]),
        DType::F32,
    );
    let column_blocks = (width as u32).div_ceil(COLUMNS);
    if segments > 0 && width > 0 {
        segment_sums_kernel::launch::<CudaRuntime>(
            &d.client,
            CubeCount::Static(segments as u32 * column_blocks, 1, 1),
            CubeDim::new_1d(COLUMNS),
            d.clone().into_tensor_arg(),
            order.into_tensor_arg(),
            starts.into_tensor_arg(),
            sums.clone().into_tensor_arg(),
            width as u32,
            column_blocks,
            d.dtype.into(),
        );
    }
    Some(as_float(sums))
}
