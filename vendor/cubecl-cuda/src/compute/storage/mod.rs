pub mod ceiling;
pub mod cpu;
pub mod gpu;
