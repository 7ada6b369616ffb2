//! Linear layers over every token of a `[batch, seq, d]` input as one 2-D
//! matmul.
//!
//! burn's `linear` on a 3-D input broadcasts the weight into a batched matmul.
//! Its weight gradient is then formed per sequence (`[batch, d_in, d_out]`) and
//! summed afterwards: `batch` times the weight's memory (3.3 GB for the 8B
//! Llama's LM head at batch 4, which cubecl serves from a 20 GB page) and
//! `batch` thin GEMMs where one would do. Merging the batch and sequence
//! dimensions first gives the same values with one GEMM per gradient.

use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use burn::tensor::Tensor;

/// `x · W (+ b)` for `x: [batch, seq, d_in]` and `weight: [d_in, d_out]`.
pub fn linear_tokens<B: Backend>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 3> {
    let [batch, seq, d_in] = x.dims();
    let d_out = weight.dims()[1];
    linear(x.reshape([batch * seq, d_in]), weight, bias).reshape([batch, seq, d_out])
}

/// `layer.forward(x)` for `x: [batch, seq, d_in]`, as one 2-D matmul.
pub fn forward_tokens<B: Backend>(layer: &Linear<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    linear_tokens(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::nn::LinearConfig;
    use burn::tensor::{Distribution, TensorData, Tolerance};

    type B = Autodiff<Flex>;

    #[test]
    fn same_values_and_gradients_as_burn_linear() {
        let device = Default::default();
        let layer = LinearConfig::new(6, 5).init::<B>(&device);
        let x = Tensor::<B, 3>::random([3, 4, 6], Distribution::Normal(0.0, 1.0), &device)
            .require_grad();
        let ours = forward_tokens(&layer, x.clone());
        let burns = layer.forward(x.clone());
        ours.to_data()
            .assert_approx_eq::<f32>(&burns.to_data(), Tolerance::default());

        let g_ours = (ours * 1.5).sum().backward();
        let g_burn = (burns * 1.5).sum().backward();
        let close =
            |a: TensorData, b: TensorData| a.assert_approx_eq::<f32>(&b, Tolerance::default());
        close(
            layer.weight.grad(&g_ours).unwrap().to_data(),
            layer.weight.grad(&g_burn).unwrap().to_data(),
        );
        let bias = layer.bias.as_ref().unwrap();
        close(
            bias.grad(&g_ours).unwrap().to_data(),
            bias.grad(&g_burn).unwrap().to_data(),
        );
        x.grad(&g_ours)
            .unwrap()
            .to_data()
            .assert_approx_eq::<f32>(&x.grad(&g_burn).unwrap().to_data(), Tolerance::default());
    }
}
