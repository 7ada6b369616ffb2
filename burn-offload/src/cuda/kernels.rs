//! Launch geometry shared by our CubeCL kernels.

use cubecl::{CubeCount, CubeDim};

/// Units per plane on NVIDIA GPUs.
pub(super) const PLANE: u32 = 32;
/// Rows (planes) per cube of a plane-per-row kernel.
pub(super) const ROWS_PER_CUBE: u32 = 8;

/// The launch of a kernel that gives each of `rows` rows of `row_len`
/// values a plane (`ROWS_PER_CUBE` planes a cube, the plane's lanes along
/// `CUBE_DIM_X`, the row among the cube's along `UNIT_POS_Y`); `None` when
/// there is nothing to compute.
pub(crate) fn plane_per_row(rows: usize, row_len: usize) -> Option<(CubeCount, CubeDim)> {
    (rows > 0 && row_len > 0).then(|| {
        (
            CubeCount::Static(rows.div_ceil(ROWS_PER_CUBE as usize) as u32, 1, 1),
            CubeDim::new_2d(PLANE, ROWS_PER_CUBE),
        )
    })
}
