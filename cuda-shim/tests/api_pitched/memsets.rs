//! 2D memsets into the pitched allocation, synchronous and on a stream, and their bad
//! input.

use super::*;

pub(crate) fn two_d_memsets(t: &Setup) {
    let Setup {
        ref cu,
        w,
        h,
        dp,
        pitch,
        s,
    } = *t;
    let mut whole = vec![0u8; pitch * h];
    // 2D memsets: 32-bit values in 20 of each row's 128 words, the rest untouched.
    assert_eq!(
        call!(cu, "cuMemsetD8", fn(u64, u8, usize), dp, 0, pitch * h),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD2D32",
            fn(u64, usize, c_uint, usize, usize),
            dp,
            pitch,
            0xA5A5_0001,
            20,
            h
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD2D16Async",
            fn(u64, usize, u16, usize, usize, Ptr),
            dp + 100,
            pitch,
            0x0202,
            4,
            h,
            s
        ),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s), OK);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            whole.as_mut_ptr().cast(),
            dp,
            pitch * h
        ),
        OK
    );
    for r in 0..h {
        let row = &whole[r * pitch..(r + 1) * pitch];
        for k in 0..20 {
            assert_eq!(
                u32::from_le_bytes(row[k * 4..k * 4 + 4].try_into().unwrap()),
                0xA5A5_0001
            );
        }
        assert!(row[80..100].iter().all(|&b| b == 0));
        assert!(row[100..108].iter().all(|&b| b == 2));
        assert!(row[108..].iter().all(|&b| b == 0));
    }
    let md8 = |d: u64, p: usize, w: usize, h: usize| {
        call!(
            cu,
            "cuMemsetD2D8",
            fn(u64, usize, u8, usize, usize),
            d,
            p,
            1,
            w,
            h
        )
    };
    assert_eq!(
        md8(dp, pitch, w, h + 1),
        INVALID_VALUE,
        "a row past the allocation"
    );
    assert_eq!(md8(dp, 50, w, h), INVALID_VALUE, "a pitch below the row");
    assert_eq!(
        md8(dp, usize::MAX / 2, w, 2),
        INVALID_VALUE,
        "a pitch past the limit"
    );
    assert_eq!(md8(0xdead_0000, pitch, w, h), INVALID_VALUE);
    assert_eq!(
        call!(
            cu,
            "cuMemsetD2D32",
            fn(u64, usize, c_uint, usize, usize),
            dp + 2,
            pitch,
            1,
            4,
            2
        ),
        INVALID_VALUE,
        "misaligned"
    );
    assert_eq!(md8(dp, pitch, 0, h), OK, "nothing to set");
}
