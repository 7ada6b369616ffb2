//! burn-offload: train language models larger than GPU memory on one GPU.
//!
//! Parameters and optimizer state live in host memory; the GPU is a transient
//! compute engine that sees one or two transformer blocks at a time. See
//! `DESIGN.md` (shared design notes) for the whole picture.
//!
//! This crate currently defines the contract models implement ([`BlockModel`],
//! [`DecoderBlock`]) so that the offload engine can drive them block by block.

pub mod model;

pub use model::{BlockModel, DecoderBlock};
