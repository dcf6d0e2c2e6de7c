//! Unit tests for the GGUF parser: one hand-built buffer per error kind.

use super::*;
use crate::testutil::{file, gstr, Gguf, FILE};

fn parse(b: &[u8]) -> Result<GgufHeader, FormatError> {
    parse_gguf(file(), b)
}

/// Asserts the error's kind, tensor and field, and that it names the file.
#[track_caller]
fn expect(
    r: Result<GgufHeader, FormatError>,
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

fn one_tensor() -> Gguf {
    // 8 x 2 f32 (ne = [2, 8]) = 64 bytes.
    Gguf::new()
        .kv_str("general.architecture", "llama")
        .tensor("w", &[2, 8], 0, 0)
        .data(64)
}

#[test]
fn parses_all_value_types() {
    let mut arr = Vec::new();
    arr.extend_from_slice(&9u32.to_le_bytes()); // array of arrays
    arr.extend_from_slice(&2u64.to_le_bytes());
    for v in [[1u8, 2], [3, 4]] {
        arr.extend_from_slice(&0u32.to_le_bytes());
        arr.extend_from_slice(&2u64.to_le_bytes());
        arr.extend_from_slice(&v);
    }
    let mut strs = 8u32.to_le_bytes().to_vec();
    strs.extend_from_slice(&2u64.to_le_bytes());
    gstr(&mut strs, b"a");
    gstr(&mut strs, "\u{e9}".as_bytes());
    let g = Gguf::new()
        .kv("u8", 0, &[200])
        .kv("i8", 1, &[0xff])
        .kv("u16", 2, &65535u16.to_le_bytes())
        .kv("i16", 3, &(-2i16).to_le_bytes())
        .kv_u32("u32", 7)
        .kv("i32", 5, &(-3i32).to_le_bytes())
        .kv("f32", 6, &1.5f32.to_le_bytes())
        .kv("bool", 7, &[1])
        .kv_str("str", "hi")
        .kv("arr", 9, &arr)
        .kv("strs", 9, &strs)
        .kv("u64", 10, &u64::MAX.to_le_bytes())
        .kv("i64", 11, &i64::MIN.to_le_bytes())
        .kv("f64", 12, &0.25f64.to_le_bytes())
        .tensor("a", &[32, 2], 8, 0) // Q8_0: 2 rows of one block = 68 bytes
        .tensor("b", &[3], 0, 96)
        .tensor("s", &[], 0, 128)
        .data(132);
    let h = parse(&g.build()).unwrap();
    use MetaValue as M;
    let want = [
        ("u8", M::U8(200)),
        ("i8", M::I8(-1)),
        ("u16", M::U16(65535)),
        ("i16", M::I16(-2)),
        ("u32", M::U32(7)),
        ("i32", M::I32(-3)),
        ("f32", M::F32(1.5)),
        ("bool", M::Bool(true)),
        ("str", M::String("hi".into())),
        (
            "arr",
            M::Array(MetaArray::Array(vec![
                MetaArray::U8(vec![1, 2]),
                MetaArray::U8(vec![3, 4]),
            ])),
        ),
        (
            "strs",
            M::Array(MetaArray::String(["a", "\u{e9}"].into_iter().collect())),
        ),
        ("u64", M::U64(u64::MAX)),
        ("i64", M::I64(i64::MIN)),
        ("f64", M::F64(0.25)),
    ];
    let got: Vec<(&str, &MetaValue)> = h.metadata().iter().map(|(k, v)| (k.as_str(), v)).collect();
    let want: Vec<(&str, &MetaValue)> = want.iter().map(|(k, v)| (*k, v)).collect();
    assert_eq!(got, want);
    assert_eq!(h.get("u64").and_then(MetaValue::as_u64), Some(u64::MAX));
    assert_eq!(h.get("missing"), None);
    assert_eq!((h.version(), h.alignment()), (3, 32));
    assert_eq!(h.data_offset() % 32, 0);
    let a = h.tensor("a").unwrap();
    assert_eq!(
        (a.dtype, a.shape.as_slice(), a.nbytes, a.offset),
        (DType::Q8_0, &[2u64, 32][..], 68, h.data_offset())
    );
    let s = h.tensor("s").unwrap();
    assert_eq!((s.shape.len(), s.n_elements(), s.nbytes), (0, 1, 4));
    assert_eq!(
        h.tensors()
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "s"]
    );
}

/// An array value: element tag, count, then the stored elements.
fn arr(elem: u32, count: u64, elems: &[u8]) -> Vec<u8> {
    let mut out = elem.to_le_bytes().to_vec();
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(elems);
    out
}

#[test]
fn arrays_are_stored_by_element_type() {
    let f32s: Vec<u8> = [0.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let i64s: Vec<u8> = [-1i64, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
    let i16s: Vec<u8> = [-3i16].iter().flat_map(|x| x.to_le_bytes()).collect();
    let g = Gguf::new()
        .kv("i8s", 9, &arr(1, 2, &[0xff, 1]))
        .kv("i16s", 9, &arr(3, 1, &i16s))
        .kv("f32s", 9, &arr(6, 2, &f32s))
        .kv("bools", 9, &arr(7, 3, &[1, 0, 1]))
        .kv("i64s", 9, &arr(11, 2, &i64s))
        .kv("none", 9, &arr(8, 0, &[]));
    let h = parse(&g.header()).unwrap();
    let get = |k: &str| h.get(k).and_then(MetaValue::as_array).unwrap();
    assert_eq!(get("i8s"), &MetaArray::I8(vec![-1, 1]));
    assert_eq!(get("i16s"), &MetaArray::I16(vec![-3]));
    assert_eq!(get("f32s"), &MetaArray::F32(vec![0.5, -2.0]));
    assert_eq!(get("bools"), &MetaArray::Bool(vec![true, false, true]));
    assert_eq!(get("i64s"), &MetaArray::I64(vec![-1, 7]));
    // An empty array keeps its element type.
    assert_eq!(get("none"), &MetaArray::String(StrArray::default()));
    assert_eq!(get("none").elem_type_name(), "string");
    let bad = Gguf::new().kv("bools", 9, &arr(7, 2, &[1, 2]));
    expect(parse(&bad.header()), "invalid_value", None, "bools");
}

#[test]
fn version_2_and_custom_alignment() {
    let mut g = one_tensor().kv_u32(ALIGNMENT_KEY, 64);
    g.version = 2;
    g.alignment = 64;
    let h = parse(&g.build()).unwrap();
    assert_eq!(
        (h.version(), h.alignment(), h.data_offset() % 64),
        (2, 64, 0)
    );
}

#[test]
fn header_only_file_needs_no_padding() {
    let g = Gguf::new().kv_str("tokenizer.ggml.model", "gpt2");
    let h = parse(&g.header()).unwrap();
    assert!(h.data_offset() >= h.file_size());
}

#[test]
fn bad_magic_and_version() {
    let mut b = one_tensor().build();
    b[0] = b'X';
    expect(parse(&b), "bad_magic", None, "magic");
    for v in [1u32, 4, 0x0300_0000] {
        let mut g = one_tensor();
        g.version = v;
        expect(parse(&g.build()), "unsupported_version", None, "version");
    }
    expect(parse(b"GG"), "truncated", None, "magic");
}

#[test]
fn every_truncation_is_an_error() {
    let b = one_tensor().build();
    for n in 0..b.len() {
        let e = parse(&b[..n]).expect_err("a prefix must not parse");
        assert!(
            matches!(e.kind(), "truncated" | "out_of_bounds"),
            "prefix {n}: {e}"
        );
    }
    expect(parse(&b[..b.len() - 1]), "truncated", Some("w"), "data");
}

#[test]
fn unknown_dtype() {
    let g = Gguf::new().tensor("w", &[32], 4, 0).data(64);
    let e = expect(parse(&g.build()), "unknown_dtype", Some("w"), "dtype");
    assert!(e.to_string().contains("ggml type 4"), "{e}");
}

#[test]
fn misaligned_offset() {
    let g = Gguf::new().tensor("w", &[4], 0, 8).data(64);
    expect(parse(&g.build()), "misaligned", Some("w"), "offset");
}

#[test]
fn duplicate_names() {
    let g = Gguf::new()
        .tensor("w", &[4], 0, 0)
        .tensor("w", &[4], 0, 32)
        .data(64);
    expect(parse(&g.build()), "duplicate_name", Some("w"), "name");
    let g = Gguf::new().kv_u32("k", 1).kv_u32("k", 2);
    expect(parse(&g.build()), "duplicate_name", None, "k");
}

#[test]
fn absurd_counts_are_refused_before_allocation() {
    let mut b = one_tensor().build();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    expect(parse(&b), "absurd_count", None, "tensor_count");
    let mut b = one_tensor().build();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    expect(parse(&b), "absurd_count", None, "metadata_kv_count");
    // Within the limits, but more than the bytes left can hold.
    let mut b = one_tensor().build();
    b[8..16].copy_from_slice(&1000u64.to_le_bytes());
    expect(parse(&b), "truncated", None, "tensor_count");

    let mut arr = 0u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
    expect(
        parse(&Gguf::new().kv("a", 9, &arr).build()),
        "absurd_count",
        None,
        "a",
    );
    let mut arr = 8u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&100u64.to_le_bytes());
    expect(
        parse(&Gguf::new().kv("a", 9, &arr).build()),
        "truncated",
        None,
        "a",
    );
    // A string length beyond the file.
    let mut s = Vec::new();
    s.extend_from_slice(&u64::MAX.to_le_bytes());
    expect(
        parse(&Gguf::new().kv("s", 8, &s).build()),
        "truncated",
        None,
        "s",
    );
}

#[test]
fn limits_bound_values_bytes_names_and_dims() {
    let mut arr = 0u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&100u64.to_le_bytes());
    arr.extend_from_slice(&[0; 100]);
    let b = Gguf::new().kv("a", 9, &arr).build();
    let small = GgufLimits {
        max_metadata_values: 50,
        ..GgufLimits::default()
    };
    let e = parse_gguf_with_limits(file(), &b, &small).unwrap_err();
    assert_eq!((e.kind(), e.field()), ("absurd_count", Some("a")));
    let small = GgufLimits {
        max_metadata_bytes: 64,
        ..GgufLimits::default()
    };
    let e = parse_gguf_with_limits(file(), &b, &small).unwrap_err();
    assert_eq!((e.kind(), e.field()), ("absurd_count", Some("a")));
    let small = GgufLimits {
        max_name_len: 3,
        ..GgufLimits::default()
    };
    let b = Gguf::new().kv_u32("long", 1).build();
    let e = parse_gguf_with_limits(file(), &b, &small).unwrap_err();
    assert_eq!(
        (e.kind(), e.field()),
        ("absurd_count", Some("metadata[0].key"))
    );
    let g = Gguf::new().tensor("w", &[1, 1, 1, 1, 1], 0, 0).data(32);
    expect(parse(&g.build()), "absurd_count", Some("w"), "n_dims");
}

#[test]
fn nesting_depth_is_bounded() {
    let depth = GgufLimits::default().max_array_depth + 1;
    let mut v = Vec::new();
    for _ in 0..depth {
        v.extend_from_slice(&9u32.to_le_bytes());
        v.extend_from_slice(&1u64.to_le_bytes());
    }
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    expect(
        parse(&Gguf::new().kv("deep", 9, &v).build()),
        "too_deep",
        None,
        "deep",
    );
}

#[test]
fn bad_utf8() {
    let mut b = Gguf::new().kv_str("k", "ab").header();
    let at = b.len() - 1;
    b[at] = 0xff;
    let e = expect(parse(&b), "bad_utf8", None, "k");
    assert!(matches!(e, FormatError::BadUtf8 { offset, .. } if offset == at as u64));
    let b = Gguf::new().tensor("w\u{e9}", &[4], 0, 0).data(32).build();
    let mut b2 = b.clone();
    let pos = b.windows(2).position(|w| w == "\u{e9}".as_bytes()).unwrap();
    b2[pos] = 0xff;
    expect(parse(&b2), "bad_utf8", None, "tensor_infos[0].name");
}

#[test]
fn invalid_values() {
    expect(
        parse(&Gguf::new().kv("b", 7, &[2]).build()),
        "invalid_value",
        None,
        "b",
    );
    expect(
        parse(&Gguf::new().kv("x", 13, &[0; 8]).build()),
        "invalid_value",
        None,
        "x",
    );
    let mut arr = 99u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&0u64.to_le_bytes());
    expect(
        parse(&Gguf::new().kv("x", 9, &arr).build()),
        "invalid_value",
        None,
        "x",
    );
    for a in [0u32, 3, 48] {
        expect(
            parse(&one_tensor().kv_u32(ALIGNMENT_KEY, a).build()),
            "invalid_value",
            None,
            ALIGNMENT_KEY,
        );
    }
    let g = one_tensor().kv(ALIGNMENT_KEY, 10, &32u64.to_le_bytes());
    expect(parse(&g.build()), "invalid_value", None, ALIGNMENT_KEY);
    let g = Gguf::new().tensor("w", &[1u64 << 63], 0, 0).data(32);
    expect(parse(&g.build()), "invalid_value", Some("w"), "shape");
    let g = Gguf::new().tensor("q", &[16, 2], 2, 0).data(64); // Q4_0 rows of 16
    expect(parse(&g.build()), "invalid_value", Some("q"), "shape");
}

#[test]
fn overflowing_sizes() {
    let g = Gguf::new().tensor("w", &[1 << 40, 1 << 40], 0, 0).data(32);
    expect(parse(&g.build()), "overflow", Some("w"), "shape");
    let g = Gguf::new().tensor("w", &[1 << 62], 0, 0).data(32); // 2^62 f32 = 2^64 bytes
    expect(parse(&g.build()), "overflow", Some("w"), "shape");
    let g = Gguf::new().tensor("w", &[4], 0, u64::MAX - 31).data(32);
    expect(parse(&g.build()), "overflow", Some("w"), "offset");
}

#[test]
fn ranges_out_of_file_and_overlapping() {
    let g = Gguf::new().tensor("w", &[4], 0, 1 << 20).data(32);
    expect(parse(&g.build()), "out_of_bounds", Some("w"), "offset");
    let g = Gguf::new().tensor("w", &[16], 0, 0).data(32);
    expect(parse(&g.build()), "truncated", Some("w"), "data");
    let g = Gguf::new()
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[4], 0, 64)
        .tensor("c", &[16], 0, 96)
        .data(160);
    parse(&g.build()).unwrap();
    let g = Gguf::new()
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[4], 0, 64)
        .tensor("c", &[16], 0, 64)
        .data(160);
    let e = expect(parse(&g.build()), "overlap", Some("c"), "offset");
    assert!(e.to_string().contains("'b'"), "{e}");
}

#[test]
fn open_maps_and_borrows() {
    let dir = crate::testutil::TempDir::new("gguf-open");
    let p = dir.write("m.gguf", &one_tensor().build());
    let f = GgufFile::open(&p).unwrap();
    assert_eq!((f.path(), f.version(), f.alignment()), (p.as_path(), 3, 32));
    assert_eq!(
        f.get("general.architecture").and_then(MetaValue::as_str),
        Some("llama")
    );
    let w = f.tensor("w").unwrap();
    assert_eq!(w.shape, [8, 2]);
    assert_eq!(f.tensor_bytes(w), (0..64u8).collect::<Vec<_>>());
    assert_eq!(f.file_size(), f.data_offset() + 64);
    let e = GgufFile::open(dir.0.join("missing.gguf")).unwrap_err();
    assert!(
        matches!(&e, FormatError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    assert_eq!(e.file(), dir.0.join("missing.gguf"));
    let e = GgufFile::open(dir.write("empty.gguf", b"")).unwrap_err();
    assert_eq!((e.kind(), e.field()), ("truncated", Some("magic")));
}
