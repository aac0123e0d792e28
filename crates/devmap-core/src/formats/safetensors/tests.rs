//! Unit tests of `safetensors`.

use super::*;

fn file_with(header: &str, data_len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.resize(v.len() + data_len, 0);
    v
}

fn err(bytes: &[u8]) -> String {
    match parse_header(Path::new("x.safetensors"), bytes, bytes.len() as u64) {
        Ok(h) => panic!("expected an error, got {h:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn round_trip_through_encoder() {
    let meta = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
    let entries = [
        HeaderEntry {
            name: "a".into(),
            dtype: DType::F32,
            shape: vec![2, 2].into(),
            begin: 0,
            end: 16,
        },
        HeaderEntry {
            name: "b".into(),
            dtype: DType::BF16,
            shape: vec![].into(),
            begin: 16,
            end: 18,
        },
    ];
    let mut bytes = encode_header(entries.clone().into_iter(), &meta);
    assert_eq!(bytes.len() as u64, header_len(entries.into_iter(), &meta));
    assert_eq!((bytes.len() - 8) % 8, 0);
    bytes.resize(bytes.len() + 18, 7);
    let h = parse_header(Path::new("x"), &bytes, bytes.len() as u64).expect("valid");
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(&*h.tensors[1].name, "b");
    assert_eq!(h.tensors[1].offset, h.data_start + 16);
    assert_eq!(h.metadata, Some(meta));
    // The reference parser agrees.
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("reference parser");
    assert_eq!(st.tensor("a").expect("a").shape(), &[2, 2]);
}

/// Each refusal has a kind a caller can act on, besides its words.
#[test]
fn hostile_headers_have_a_kind() {
    use crate::formats::Kind;
    let kind = |bytes: &[u8]| {
        parse_header(Path::new("x"), bytes, bytes.len() as u64)
            .expect_err("refused")
            .kind()
    };
    let mut huge = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    assert_eq!(kind(&huge), Some(Kind::TooLarge));
    assert_eq!(kind(&1000u64.to_le_bytes()), Some(Kind::Truncated));
    assert_eq!(kind(&file_with("{\"a\":", 0)), Some(Kind::NotTheFormat));
    let dup = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert_eq!(kind(&file_with(dup, 2)), Some(Kind::Malformed));
}

#[test]
fn hostile_headers_are_named() {
    let mut huge = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    assert!(err(&huge).contains("100 MB"));
    assert!(err(&1000u64.to_le_bytes()).contains("runs past the end"));
    assert!(err(&file_with("{\"a\":", 0)).contains("not a JSON object"));
    let mut not_utf8 = 2u64.to_le_bytes().to_vec();
    not_utf8.extend_from_slice(&[0xff, 0xfe]);
    assert!(err(&not_utf8).contains("not UTF-8"));
    let dup = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert!(err(&file_with(dup, 2)).contains("`w`: appears twice"));
    let dup_meta = r#"{"__metadata__":{"format":"pt"},"__metadata__":{"format":"np"},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    assert!(err(&file_with(dup_meta, 1)).contains("`__metadata__` appears twice"));
    let unknown = r#"{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#;
    assert!(err(&file_with(unknown, 1)).contains("unknown dtype `Q4`"));
    let mismatch = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    assert!(err(&file_with(mismatch, 8)).contains("needs 12"));
    let overflow = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#;
    assert!(err(&file_with(overflow, 8)).contains("overflows"));
    let hole = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert!(err(&file_with(hole, 2)).contains("hole"));
    let overlap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
    assert!(err(&file_with(overlap, 3)).contains("overlap"));
    let beyond = r#"{"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    assert!(err(&file_with(beyond, 2)).contains("truncated"));
    let trailing = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    assert!(err(&file_with(trailing, 5)).contains("4 bytes after the last tensor"));
    let negative = r#"{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#;
    assert!(err(&file_with(negative, 1)).contains("non-negative"));
}

#[test]
fn empty_and_zero_dim_tensors() {
    let h = r#"{"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}"#;
    let bytes = file_with(h, 8);
    let parsed = parse_header(Path::new("x"), &bytes, bytes.len() as u64).expect("valid");
    assert_eq!(parsed.tensors.len(), 2);
    assert_eq!(&*parsed.tensors[0].name, "e");
    assert_eq!(parsed.tensors[0].len, 0);
}

#[test]
fn a_prefix_and_the_file_length_are_enough() {
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}"#;
    let whole = file_with(h, 11);
    let len = whole.len() as u64;
    let from_whole = parse_header(Path::new("x"), &whole, len).expect("whole file");
    let header_end = from_whole.data_start as usize;
    let from_prefix = parse_header(Path::new("x"), &whole[..header_end], len).expect("prefix");
    assert_eq!(from_prefix, from_whole);
    // A prefix that stops inside the header says so; a wrong length is still caught.
    let cut = parse_header(Path::new("x"), &whole[..header_end - 1], len)
        .expect_err("cut header")
        .to_string();
    assert!(cut.contains("cut short"), "{cut}");
    let short = parse_header(Path::new("x"), &whole[..header_end], len - 1)
        .expect_err("file shorter than the data")
        .to_string();
    assert!(short.contains("truncated"), "{short}");
}

/// A file's header is read in 64 KiB pieces: a character cut between two reads
/// is whole UTF-8, and a bad byte far in is still named as not UTF-8.
#[test]
fn a_header_read_in_pieces_is_checked_across_them() {
    use std::fmt::Write as _;
    let mut header = String::from("{");
    for i in 0..3000 {
        let _ = write!(
            header,
            "\"couche_\u{e9}t\u{e9}_\u{1f600}.{i}\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[{i},{}]}},",
            i + 1
        );
    }
    header.pop();
    header.push('}');
    assert!(header.len() > 3 * (1 << 16), "spans several reads");
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("model.safetensors");
    std::fs::write(&path, file_with(&header, 3000)).expect("write");
    let read = read_header(&path).expect("a valid header read in pieces");
    assert_eq!(read.tensors.len(), 3000);
    assert!(
        read.tensors
            .iter()
            .any(|t| &*t.name == "couche_\u{e9}t\u{e9}_\u{1f600}.2999")
    );
    // The same header with one byte made invalid near its end.
    let mut bytes = file_with(&header, 3000);
    let at = 8 + header.len() - 40;
    bytes[at] = 0xff;
    std::fs::write(&path, &bytes).expect("write");
    let e = read_header(&path).expect_err("not UTF-8").to_string();
    assert!(e.contains("not UTF-8"), "{e}");
}
