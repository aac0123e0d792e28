//! Unit tests of `deepspeed`.

use super::*;

#[test]
fn ranks_come_from_deepspeeds_file_names() {
    assert_eq!(
        rank_in(
            "zero_pp_rank_3_mp_rank_00_optim_states.pt",
            "_optim_states.pt"
        ),
        Some(3)
    );
    assert_eq!(
        rank_in(
            "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
            "_optim_states.pt"
        ),
        Some(1)
    );
    assert_eq!(
        rank_in(
            "zero_pp_rank_1_mp_rank_01_optim_states.pt",
            "_optim_states.pt"
        ),
        None
    );
    assert_eq!(
        rank_in("mp_rank_00_model_states.pt", "_optim_states.pt"),
        None
    );
}

#[test]
fn model_parallel_ranks_are_refused_by_name() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    for name in [
        "mp_rank_00_model_states.pt",
        "mp_rank_01_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_0_mp_rank_01_optim_states.pt",
    ] {
        std::fs::write(dir.path().join(name), b"")?;
    }
    let Err(err) = read_deepspeed(dir.path()) else {
        panic!("a checkpoint with two model-parallel ranks was read");
    };
    let text = err.to_string();
    assert!(text.contains("mp_rank_01_model_states.pt"), "{text}");
    assert!(text.contains("model-parallel"), "{text}");
    std::fs::remove_file(dir.path().join("mp_rank_01_model_states.pt"))?;
    std::fs::remove_file(dir.path().join("zero_pp_rank_0_mp_rank_01_optim_states.pt"))?;
    assert!(model_parallel_file(dir.path()).is_none());
    // A pipeline's layer files.
    std::fs::write(dir.path().join("layer_01-model_00-model_states.pt"), b"")?;
    assert_eq!(
        model_parallel_file(dir.path()),
        Some(dir.path().join("layer_01-model_00-model_states.pt"))
    );
    Ok(())
}

#[test]
fn a_ranks_share_crossing_groups_is_two_pieces() {
    let groups = [
        Flat {
            file: 2,
            offset: 100,
            elements: 10,
        },
        Flat {
            file: 2,
            offset: 500,
            elements: 10,
        },
    ];
    let pieces = across_groups(&groups, 8, 4, 5, DType::F32);
    assert_eq!(pieces.len(), 2);
    assert_eq!(
        (
            pieces[0].range.offset,
            pieces[0].range.len,
            pieces[0].offsets[0]
        ),
        (132, 8, 4)
    );
    assert_eq!(
        (
            pieces[1].range.offset,
            pieces[1].range.len,
            pieces[1].offsets[0]
        ),
        (500, 12, 6)
    );
}
