//! devmap's casts against torch without torch: tests/data/cast_expected.txt holds
//! fingerprints (FNV-1a 64) of torch's `.to()` results over a fixed set of inputs —
//! every float16 and bfloat16 bit pattern, and a float32 grid around every rounding
//! decision — made by scripts/gen_cast_table.py where torch is installed (on x86-64
//! with torch's AVX-512 kernels: the table is that platform's behaviour). This test
//! builds the same inputs, casts them with devmap's code and must reach the same
//! fingerprints. (tests/python/dtype_cast.py compares element by element in CI.)

use devmap::save::cast::cast;
use devmap::types::DType;

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The float32 inputs, exactly as scripts/gen_cast_table.py builds them.
fn f32_grid() -> Vec<u32> {
    let mut out = Vec::new();
    for low in [0x0000u32, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF] {
        out.extend((0..1u32 << 16).step_by(7).map(|high| (high << 16) | low));
    }
    for low in [0u32, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF] {
        for sign in [0u32, 1] {
            for exp in 100u32..146 {
                for k in 0..64u32 {
                    out.push((sign << 31) | (exp << 23) | ((k * 16) << 13) | low);
                }
            }
        }
    }
    out
}

#[test]
fn every_cast_matches_torchs_fingerprint() {
    let every16: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let grid: Vec<u8> = f32_grid().into_iter().flat_map(u32::to_le_bytes).collect();
    let inputs = [
        ("f16", DType::F16, &every16),
        ("bf16", DType::BF16, &every16),
        ("f32", DType::F32, &grid),
    ];
    let outputs = [
        ("f16", DType::F16),
        ("bf16", DType::BF16),
        ("f32", DType::F32),
    ];
    let expected = include_str!("data/cast_expected.txt");
    let mut checked = 0;
    for (src_name, from, data) in inputs {
        for (dst_name, to) in outputs {
            if from == to {
                continue;
            }
            let count = data.len() / from.size() as usize;
            let mut out = vec![0u8; count * to.size() as usize];
            cast(from, to, data, &mut out);
            let line = format!("{src_name}->{dst_name} {count} {:016x}", fnv1a(&out));
            assert!(
                expected.lines().any(|l| l == line),
                "{line} is not torch's (see tests/data/cast_expected.txt)"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 6);
}
