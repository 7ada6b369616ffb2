//! Page-aligned host buffers (f32, and bf16 viewed in one): what DMA
//! engines and page-locking want.

use std::alloc::{self, Layout};

use burn::tensor::bf16;
use rayon::prelude::*;

const PAGE: usize = 4096;

/// A page-aligned, zero-initialised `f32` buffer.
pub struct Slab {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: a Slab exclusively owns its allocation, like a Box<[f32]>.
unsafe impl Send for Slab {}
unsafe impl Sync for Slab {}

impl Slab {
    /// `len` zeros, page-aligned (zeroed in parallel).
    pub fn zeros(len: usize) -> Self {
        if len == 0 {
            return Self {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len,
            };
        }
        let layout = Self::layout(len);
        // Not `alloc_zeroed`: with page alignment it zeroes on one thread,
        // which took tens of seconds for a multi-billion-parameter store.
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc(layout) } as *mut f32;
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        const CHUNK: usize = 1 << 18;
        let base = ptr as usize;
        (0..len.div_ceil(CHUNK)).into_par_iter().for_each(|i| {
            let start = i * CHUNK;
            // SAFETY: chunks are disjoint ranges inside the `len` f32 just allocated.
            unsafe {
                (base as *mut f32)
                    .add(start)
                    .write_bytes(0, CHUNK.min(len - start))
            };
        });
        Self { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len * std::mem::size_of::<f32>(), PAGE)
            .expect("slab size overflows")
    }

    /// Number of `f32` in the slab.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slab holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes this slab occupies.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<f32>()
    }

    /// The values.
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: ptr is valid for len elements (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The values, to write.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeros` with this exact layout.
            unsafe { alloc::dealloc(self.ptr as *mut u8, Self::layout(self.len)) }
        }
    }
}

/// A page-aligned, zero-initialised `bf16` buffer: a [`Slab`] of half as
/// many `f32`, viewed as bf16.
pub struct Bf16Slab {
    slab: Slab,
    len: usize,
}

impl Bf16Slab {
    /// `len` zeros, page-aligned.
    pub fn zeros(len: usize) -> Self {
        Self {
            slab: Slab::zeros(len.div_ceil(2)),
            len,
        }
    }

    /// Number of `bf16` in the slab.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slab holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes this slab occupies.
    pub fn bytes(&self) -> usize {
        self.slab.bytes()
    }

    /// The values.
    pub fn as_slice(&self) -> &[bf16] {
        &bytemuck::cast_slice(self.slab.as_slice())[..self.len]
    }

    /// The values, to write.
    pub fn as_mut_slice(&mut self) -> &mut [bf16] {
        &mut bytemuck::cast_slice_mut(self.slab.as_mut_slice())[..self.len]
    }
}
