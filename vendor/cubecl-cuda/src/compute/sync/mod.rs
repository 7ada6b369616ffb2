mod drop_queue;
mod fence;

pub use drop_queue::*;
pub use fence::*;
