//! Unit tests of `pickle`.

use super::*;

/// `{"args": argparse.Namespace(num_attention_heads=8, params_dtype=torch.bfloat16,
/// attention_backend=AttnBackend.local)}`, as Megatron-LM's common.pt holds it
/// (protocol 2, made by Python's pickle).
const MEGATRON_ARGS: &[u8] = b"\x80\x02}q\x00X\x04\x00\x00\x00argsq\x01cargparse\nNamespace\nq\x02)\x81q\x03}q\x04(X\x13\x00\x00\x00num_attention_headsq\x05K\x08X\x0c\x00\x00\x00params_dtypeq\x06ctorch\nbfloat16\nq\x07X\x11\x00\x00\x00attention_backendq\x08cmegatron.core.transformer.enums\nAttnBackend\nq\tK\x04\x85q\nRq\x0bubs.";

#[test]
fn megatron_arguments_are_read_as_data_and_only_there() {
    let value = read_as(MEGATRON_ARGS, Allow::MegatronCommon).expect("reads");
    let Value::Dict(items) = value else {
        panic!("{value:?}")
    };
    let Value::Object { class, state } = &items[0].1 else {
        panic!("{items:?}")
    };
    assert_eq!(*class, "Namespace");
    let Value::Dict(fields) = state.as_ref() else {
        panic!("{state:?}")
    };
    assert_eq!(fields[0].1, Value::Int(8));
    assert_eq!(fields[1].1, Value::DType(DType::BF16));
    assert_eq!(fields[2].1, Value::Int(4));
    // A state dict's reader knows none of them.
    assert!(matches!(
        read_as(MEGATRON_ARGS, Allow::StateDict),
        Err(Error::Forbidden(_))
    ));
    // Nor does Megatron's a callable.
    let system = b"\x80\x02}X\x04\x00\x00\x00argscposix\nsystem\ns.";
    assert!(matches!(
        read_as(system, Allow::MegatronCommon),
        Err(Error::Forbidden(_))
    ));
}

/// `Metadata()` then `BUILD {"state_dict_metadata": {}}`, protocol 4.
fn dcp_object_pickle() -> Vec<u8> {
    let mut p = vec![0x80, 4];
    for text in ["torch.distributed.checkpoint.metadata", "Metadata"] {
        p.push(0x8c);
        p.push(text.len() as u8);
        p.extend_from_slice(text.as_bytes());
    }
    p.extend_from_slice(&[0x93, b')', 0x81, b'}', b'(']);
    p.push(0x8c);
    p.push(19);
    p.extend_from_slice(b"state_dict_metadata");
    p.extend_from_slice(b"}ub.");
    p
}

#[test]
fn dcp_dataclasses_are_data_and_only_where_metadata_is_read() {
    let bytes = dcp_object_pickle();
    let value = read_as(&bytes, Allow::DcpMetadata).expect("metadata");
    let Value::Object { class, state } = value else {
        panic!("not an object: {value:?}");
    };
    assert_eq!(class, "Metadata");
    assert_eq!(
        *state,
        Value::Dict(vec![(
            Value::Str("state_dict_metadata".into()),
            Value::Dict(Vec::new())
        )])
    );
    // A state dict never names them.
    assert!(matches!(read(&bytes), Err(Error::Forbidden(_))));
}

/// `OrderedDict([('w', _rebuild_tensor_v2(('storage', BFloat16Storage, '0',
/// 'cpu', 6), 2, (2, 2), (2, 1), False, OrderedDict()))])`, as torch writes it.
fn state_dict_pickle() -> Vec<u8> {
    let mut p = vec![0x80, 2];
    p.extend(b"ccollections\nOrderedDict\nq\x00)R(X\x01\x00\x00\x00w");
    p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage");
    p.extend(b"ctorch\nBFloat16Storage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQ");
    p.extend(b"K\x02K\x02K\x02\x86K\x02K\x01\x86\x89h\x00)RtRu.");
    p
}

#[test]
fn a_state_dict_reads_as_tensors_of_storages() {
    let v = read(&state_dict_pickle()).expect("reads");
    let Value::Dict(items) = v else {
        panic!("{v:?}")
    };
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].0, Value::Str("w".into()));
    assert_eq!(
        items[0].1,
        Value::Tensor(TensorRef {
            storage: StorageRef {
                dtype: DType::BF16,
                key: "0".into(),
                elements: 6
            },
            offset: 2,
            shape: vec![2, 2],
            stride: vec![2, 1],
        })
    );
}

#[test]
fn a_global_a_state_dict_never_needs_is_refused_by_name() {
    let evil = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00lsR.".to_vec();
    let e = read(&evil).expect_err("refused");
    assert!(
        matches!(&e, Error::Forbidden(why) if why.contains("`os.system`")),
        "{e}"
    );
}

#[test]
fn deepspeeds_classes_are_data_and_only_where_its_checkpoints_are_read() {
    // {"zero_stage": ZeroStageEnum(2), "address": fragment_address(5, 7)}, protocol 2.
    let mut bytes = b"\x80\x02}(X\x0a\x00\x00\x00zero_stagecdeepspeed.runtime.zero.config\nZeroStageEnum\nK\x02\x85R".to_vec();
    bytes.extend_from_slice(b"X\x07\x00\x00\x00addresscdeepspeed.utils.tensor_fragment\nfragment_address\nK\x05K\x07\x86\x81u.");
    let value = read_as(&bytes, Allow::DeepSpeed).expect("deepspeed");
    let Value::Dict(items) = value else {
        panic!("a dict")
    };
    assert_eq!(items[0].1, Value::Int(2));
    assert_eq!(
        items[1].1,
        Value::Object {
            class: "fragment_address",
            state: Box::new(Value::Tuple(vec![Value::Int(5), Value::Int(7)])),
        }
    );
    // A state dict may not name them; DeepSpeed's files may not name anything else.
    assert!(matches!(read(&bytes), Err(Error::Forbidden(_))));
    let evil = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00lsR.".to_vec();
    assert!(matches!(
        read_as(&evil, Allow::DeepSpeed),
        Err(Error::Forbidden(_))
    ));
}

#[test]
fn a_cut_pickle_is_an_error_not_a_panic() {
    let full = state_dict_pickle();
    for n in 0..full.len() {
        let _ = read(&full[..n]);
    }
    assert!(read(&full[..full.len() - 1]).is_err());
}

#[test]
fn values_nesting_without_end_or_copies_that_double_are_refused() {
    let mut deep = vec![0x80, 2, b')'];
    deep.extend(std::iter::repeat_n(0x85, 100_000));
    deep.push(b'.');
    let e = read(&deep).expect_err("deep");
    assert!(
        matches!(&e, Error::Malformed(why) if why.contains("nest")),
        "{e}"
    );
    // A list put in the memo, then appended copies of itself, doubling each time.
    let mut doubling = vec![0x80, 2, b']', b'q', 0];
    for _ in 0..40 {
        doubling.extend([b'h', 0, b'a', b'q', 0]);
    }
    doubling.push(b'.');
    let e = read(&doubling).expect_err("doubling").to_string();
    assert!(e.contains("nest") || e.contains("copies"), "{e}");
}

/// `(s, s)` for `s = Shard(0)`, as Python's pickle writes it (protocol 2): the second
/// is a memo reference to the first, made before `BUILD` gave it its state.
const SHARED_SHARD: &[u8] = b"\x80\x02ctorch.distributed.tensor.placement_types\nShard\nq\x00)\x81q\x01}q\x02X\x03\x00\x00\x00dimq\x03K\x00sbh\x01\x86q\x04.";

#[test]
fn an_object_fetched_from_the_memo_has_the_state_build_gave_it() {
    let value = read_as(SHARED_SHARD, Allow::DTensor).expect("reads");
    let Value::Tuple(items) = value else {
        panic!("{value:?}")
    };
    let dim0 = Value::Dict(vec![(Value::Str("dim".into()), Value::Int(0))]);
    for item in &items {
        let Value::Object { class, state } = item else {
            panic!("{items:?}")
        };
        assert_eq!(*class, "Shard");
        assert_eq!(**state, dim0, "{items:?}");
    }
    // A state dict's reader knows no DTensor class.
    assert!(matches!(
        read_as(SHARED_SHARD, Allow::StateDict),
        Err(Error::Forbidden(_))
    ));
}
