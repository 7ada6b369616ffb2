use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::host::lookup::TokenRows;

/// `dy`'s (`[batch, seq, width]`) sums per segment of `rows`, `[segments,
/// width]`, on the device: `None` where there is no kernel for `B` (the
/// engine then reads `dy` whole and adds its rows on the host).
pub(crate) fn segment_sums<B: Backend>(
    dy: &Tensor<B, 3>,
    rows: &TokenRows,
) -> Option<Tensor<B, 2>> {
    #[cfg(feature = "cuda")]
    return super::cuda::segment_sums(dy, rows);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (dy, rows);
        None
    }
}
