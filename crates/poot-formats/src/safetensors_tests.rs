//! Unit tests for the safetensors parser: one hand-built buffer per error kind.

use super::*;
use crate::testutil::{file, safetensors, FILE};

fn parse(b: &[u8]) -> Result<SafetensorsHeader, FormatError> {
    parse_safetensors(file(), b)
}

#[track_caller]
fn expect(
    r: Result<SafetensorsHeader, FormatError>,
    kind: &str,
    tensor: Option<&str>,
    field: &str,
) -> FormatError {
    let e = r.expect_err("expected an error");
    assert_eq!(
        (e.kind(), e.tensor(), e.field()),
        (kind, tensor, Some(field)),
        "{e}"
    );
    assert_eq!(e.file(), Path::new(FILE));
    assert!(e.to_string().contains(FILE), "{e}");
    e
}

#[track_caller]
fn json(j: &str, data: usize) -> Result<SafetensorsHeader, FormatError> {
    parse(&safetensors(j, data))
}

const GOOD: &str = r#"{"__metadata__":{"format":"pt","b":"x"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"e":{"dtype":"BF16","shape":[0,5],"data_offsets":[24,24]},"s":{"dtype":"I8","shape":[],"data_offsets":[24,25],"extra":[1,{"x":null}]}}   "#;

#[test]
fn parses_tensors_and_metadata() {
    let b = safetensors(GOOD, 25);
    let h = parse(&b).unwrap();
    assert_eq!(h.data_offset(), 8 + GOOD.len() as u64);
    assert_eq!(
        h.metadata(),
        &[("format".into(), "pt".into()), ("b".into(), "x".into())]
    );
    let names: Vec<_> = h.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["w", "e", "s"]);
    let w = h.tensor("w").unwrap();
    assert_eq!(
        (w.dtype, w.shape.as_slice(), w.offset, w.nbytes),
        (DType::F32, &[2u64, 3][..], h.data_offset(), 24)
    );
    assert_eq!(h.tensor("s").unwrap().n_elements(), 1);
    assert_eq!(h.tensor("e").unwrap().nbytes, 0);
    // No metadata, null metadata, an empty header.
    json(r#"{"__metadata__":null}"#, 0).unwrap();
    assert!(json("{}", 0).unwrap().tensors().is_empty());
}

#[test]
fn header_length() {
    expect(parse(&[1, 2, 3]), "truncated", None, "header_len");
    let mut b = safetensors(GOOD, 25);
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    expect(parse(&b), "absurd_count", None, "header_len");
    let mut b = safetensors(GOOD, 25);
    let n = b.len() as u64;
    b[..8].copy_from_slice(&n.to_le_bytes());
    expect(parse(&b), "truncated", None, "header");
}

#[test]
fn every_truncation_is_an_error() {
    let b = safetensors(GOOD, 25);
    for n in 0..b.len() {
        let e = parse(&b[..n]).expect_err("a prefix must not parse");
        assert!(
            matches!(e.kind(), "truncated" | "out_of_bounds"),
            "prefix {n}: {e}"
        );
    }
    expect(parse(&b[..b.len() - 1]), "truncated", Some("s"), "data");
}

#[test]
fn bad_utf8_and_bad_json() {
    let mut b = safetensors(r#"{"a\u00e9":1}"#, 0);
    b[10] = 0xff;
    expect(parse(&b), "bad_utf8", None, "header");
    expect(json("{", 0), "bad_json", None, "header");
    expect(json("[]", 0), "bad_json", None, "header");
    expect(json("{} x", 0), "bad_json", None, "header");
    expect(
        json(r#"{"w":{"shape":[1],"data_offsets":[0,4]}}"#, 4),
        "bad_json",
        Some("w"),
        "dtype",
    );
    expect(
        json(
            r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            4,
        ),
        "bad_json",
        Some("w"),
        "shape",
    );
    expect(
        json(
            r#"{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#,
            4,
        ),
        "bad_json",
        Some("w"),
        "shape",
    );
    expect(
        json(
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
            8,
        ),
        "bad_json",
        Some("w"),
        "data_offsets",
    );
    expect(
        json(r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#, 8),
        "bad_json",
        Some("w"),
        "data_offsets",
    );
    expect(
        json(
            r#"{"w":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            4,
        ),
        "bad_json",
        Some("w"),
        "dtype",
    );
    expect(
        json(r#"{"__metadata__":{"a":1}}"#, 0),
        "bad_json",
        Some("__metadata__"),
        "__metadata__",
    );
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let j = format!(r#"{{"w":{{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":{deep}}}}}"#);
    json(&j, 4).expect("deeply nested unknown keys are skipped without recursion");
    let j = format!(r#"{{"w":{{"dtype":{deep},"shape":[1],"data_offsets":[0,4]}}}}"#);
    expect(json(&j, 4), "bad_json", Some("w"), "dtype");
    let j = format!(r#"{{"w":{deep}}}"#);
    expect(json(&j, 4), "bad_json", Some("w"), "header");
    let j = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":5}"#;
    expect(json(j, 1), "bad_json", Some("b"), "header");
    let j = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}, 5:1}"#;
    expect(json(j, 1), "bad_json", None, "header");
    let rank = format!("[{}1]", "1,".repeat(crate::json::MAX_RANK));
    let j = format!(r#"{{"w":{{"dtype":"F32","shape":{rank},"data_offsets":[0,4]}}}}"#);
    expect(json(&j, 4), "bad_json", Some("w"), "shape");
}

#[test]
fn dtype_size_and_offsets() {
    let e = expect(
        json(
            r#"{"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}"#,
            1,
        ),
        "unknown_dtype",
        Some("w"),
        "dtype",
    );
    assert!(e.to_string().contains("F4"), "{e}");
    let e = expect(
        json(
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
            8,
        ),
        "size_mismatch",
        Some("w"),
        "data_offsets",
    );
    assert!(matches!(
        e,
        FormatError::SizeMismatch {
            expected: 8,
            actual: 4,
            ..
        }
    ));
    expect(
        json(
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}"#,
            8,
        ),
        "invalid_value",
        Some("w"),
        "data_offsets",
    );
    let big = u64::MAX;
    let j = format!(r#"{{"w":{{"dtype":"F32","shape":[{big},{big}],"data_offsets":[0,4]}}}}"#);
    expect(json(&j, 4), "overflow", Some("w"), "shape");
    let j = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,4]}}}}"#,
        1u64 << 62
    );
    expect(json(&j, 4), "overflow", Some("w"), "shape");
    let j = format!(
        r#"{{"w":{{"dtype":"U8","shape":[4],"data_offsets":[{},{big}]}}}}"#,
        big - 4
    );
    expect(json(&j, 4), "overflow", Some("w"), "data_offsets");
}

#[test]
fn ranges_out_of_file_and_overlapping() {
    expect(
        json(
            r#"{"w":{"dtype":"U8","shape":[4],"data_offsets":[100,104]}}"#,
            8,
        ),
        "out_of_bounds",
        Some("w"),
        "data_offsets",
    );
    expect(
        json(
            r#"{"w":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}}"#,
            8,
        ),
        "truncated",
        Some("w"),
        "data",
    );
    let j = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#;
    let e = expect(json(j, 8), "overlap", Some("b"), "data_offsets");
    assert!(e.to_string().contains("'a'"), "{e}");
    // Gaps are allowed.
    json(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}"#,
        8,
    )
    .unwrap();
}

#[test]
fn duplicates() {
    let j = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
    expect(json(j, 8), "duplicate_name", Some("a"), "name");
    expect(
        json(r#"{"__metadata__":{"k":"1","k":"2"}}"#, 0),
        "duplicate_name",
        None,
        "__metadata__",
    );
    expect(
        json(r#"{"__metadata__":{},"__metadata__":{}}"#, 0),
        "duplicate_name",
        None,
        "__metadata__",
    );
}

#[test]
fn open_maps_and_borrows() {
    let dir = crate::testutil::TempDir::new("st-open");
    let p = dir.write("m.safetensors", &safetensors(GOOD, 25));
    let f = SafetensorsFile::open(&p).unwrap();
    assert_eq!(f.path(), p);
    let w = f.tensor("w").unwrap();
    assert_eq!(f.tensor_bytes(w), (0..24u8).collect::<Vec<_>>());
    let empty = dir.write("empty.safetensors", b"");
    let e = SafetensorsFile::open(&empty).unwrap_err();
    assert_eq!((e.kind(), e.file()), ("truncated", empty.as_path()));
    let e = SafetensorsFile::open(dir.0.join("missing.safetensors")).unwrap_err();
    assert!(
        matches!(&e, FormatError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    let e = SafetensorsFile::open(&dir.0).unwrap_err();
    assert_eq!(e.kind(), "io");
}
