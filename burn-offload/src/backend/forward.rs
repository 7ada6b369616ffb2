//! The forwarding macro: one line of `forwarded.rs` becomes one method of
//! `Offload<B>` that calls `B`'s method. Each argument and result is tagged:
//! `f` float tensor (paged in / wrapped as a device tensor), `of` optional
//! float, `vf` vector of floats, `fi` (float, int) pair, `p` unchanged.

macro_rules! forward_fns {
    ($(fn $name:ident($($k:ident $arg:ident : $ty:ty),* $(,)?) -> $rk:ident $ret:ty;)*) => {
        $(
            fn $name($($arg: $ty),*) -> $ret {
                lift!($rk, B::$name($(lower!($k, $arg)),*))
            }
        )*
    };
}

macro_rules! lower {
    (f, $x:expr) => {
        $crate::backend::lower::<B>($x)
    };
    (of, $x:expr) => {
        $x.map($crate::backend::lower::<B>)
    };
    (vf, $x:expr) => {
        $x.into_iter().map($crate::backend::lower::<B>).collect()
    };
    (p, $x:expr) => {
        $x
    };
}

macro_rules! lift {
    (f, $x:expr) => {
        $crate::backend::OffloadTensor::device($x)
    };
    (vf, $x:expr) => {
        $x.into_iter()
            .map($crate::backend::OffloadTensor::device)
            .collect()
    };
    (fi, $x:expr) => {{
        let (float, int) = $x;
        ($crate::backend::OffloadTensor::device(float), int)
    }};
    (p, $x:expr) => {
        $x
    };
}
