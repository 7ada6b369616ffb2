//! The tensor-op dequantisation on burn's CPU backend against the host
//! reference: bit for bit in f32, and the reference rounded to bf16 in bf16.

use burn::backend::Flex;
use burn::tensor::{bf16, FloatDType};

use super::*;

/// The host tests' values with some zero blocks (every 7th).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut x = super::tests::values(len, seed);
    for (block, chunk) in x.chunks_mut(64).enumerate() {
        if block % 7 == 3 {
            chunk.fill(0.0);
        }
    }
    x
}

/// Shapes with a partial last block, an odd count, more than one absmax
/// block (265 blocks), and one whole block.
const SHAPES: [[usize; 2]; 4] = [[260, 65], [3, 7], [1, 64], [0, 4]];

fn compare(device: Vec<f32>, host: &[f32], what: &str) {
    assert_eq!(device.len(), host.len(), "{what}");
    for (i, (d, h)) in device.iter().zip(host).enumerate() {
        assert_eq!(d.to_bits(), h.to_bits(), "{what} {i}: {d} vs {h}");
    }
}

fn compare_bf16(device: Vec<bf16>, host: &[f32], what: &str) {
    assert_eq!(device.len(), host.len(), "{what}");
    for (i, (d, h)) in device.iter().zip(host).enumerate() {
        assert_eq!(*d, bf16::from_f32(*h), "{what} {i}");
    }
}

#[test]
fn nf4_tensor_ops_match_the_host_dequantisation() {
    let device = Default::default();
    for (k, shape) in SHAPES.into_iter().enumerate() {
        let x = values(shape[0] * shape[1], k as u64 + 1);
        let w = quantize_nf4(&x, shape).unwrap();
        let host = w.dequantize();
        let t = Nf4Tensors::<Flex>::upload(&w, &device);
        let f32_out = t.dequantize(FloatDType::F32).unwrap();
        assert_eq!(f32_out.dims(), shape);
        compare(f32_out.into_data().to_vec().unwrap(), &host, "nf4 f32");
        let bf16_out = t.dequantize(FloatDType::BF16).unwrap();
        compare_bf16(bf16_out.into_data().to_vec().unwrap(), &host, "nf4 bf16");
    }
}

#[test]
fn int8_tensor_ops_match_the_host_dequantisation() {
    let device = Default::default();
    for (k, shape) in SHAPES.into_iter().enumerate() {
        let x = values(shape[0] * shape[1], k as u64 + 7);
        let w = quantize_int8(&x, shape).unwrap();
        let host = w.dequantize();
        let t = Int8Tensors::<Flex>::upload(&w, &device);
        let f32_out = t.dequantize(FloatDType::F32).unwrap();
        assert_eq!(f32_out.dims(), shape);
        compare(f32_out.into_data().to_vec().unwrap(), &host, "int8 f32");
        let bf16_out = t.dequantize(FloatDType::BF16).unwrap();
        compare_bf16(bf16_out.into_data().to_vec().unwrap(), &host, "int8 bf16");
    }
}

#[test]
fn tensors_of_the_wrong_size_are_refused() {
    let device = Default::default();
    let w = quantize_nf4(&values(200, 1), [10, 20]).unwrap();
    let mut t = Nf4Tensors::<Flex>::upload(&w, &device);
    t.shape = [10, 30];
    assert!(matches!(
        t.dequantize(FloatDType::F32),
        Err(QuantError::Tensors { what: "packed", .. })
    ));
    let w = quantize_int8(&values(200, 1), [10, 20]).unwrap();
    let mut t = Int8Tensors::<Flex>::upload(&w, &device);
    t.shape = [20, 10];
    assert!(matches!(
        t.dequantize(FloatDType::F32),
        Err(QuantError::Tensors { what: "scales", .. })
    ));
}

#[test]
fn bytes_pack_four_to_a_little_endian_word() {
    assert_eq!(
        pack_words(&[0x01, 0x02, 0x03, 0xF4, 0xAB]),
        vec![0xF403_0201u32 as i32, 0xAB]
    );
    assert!(pack_words(&[]).is_empty());
    // What the kernels do: `(word >> 8k) & 0xff` is byte k, negative or not.
    let bytes: Vec<u8> = (0..=255).collect();
    for (w, word) in pack_words(&bytes).into_iter().enumerate() {
        for k in 0..4 {
            assert_eq!((word >> (8 * k)) & 0xff, bytes[4 * w + k] as i32);
        }
    }
}
