//! The deterministic generator behind the built-in corpus and the batcher.

/// SplitMix64 (Steele, Lea & Flood 2014). Its whole state is one `u64`, which
/// makes checkpointing trivial, and its output is fixed by the algorithm, not
/// by any crate version.
#[derive(Debug, Clone)]
pub(super) struct SplitMix64 {
    pub(super) state: u64,
}

impl SplitMix64 {
    pub(super) fn new(state: u64) -> Self {
        Self { state }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-enough integer in `0..n` (`n > 0`) via the multiply-high trick;
    /// the bias is at most `n / 2^64`, irrelevant at our sizes. Uses `u128`
    /// rather than `usize` arithmetic so results agree on 32- and 64-bit hosts.
    pub(super) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    pub(super) fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // Reference outputs of SplitMix64 seeded with 0, from the published
        // algorithm; guards against accidental edits of the constants.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }
}
