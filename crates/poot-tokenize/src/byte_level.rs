//! GPT-2's byte-level alphabet: every byte as one printable character, so any UTF-8 text is a
//! string over 256 symbols (what `tokenizers`' `ByteLevel` pre-tokenizer and llama.cpp's
//! `unicode_byte_to_utf8` do).
//!
//! Invariant: the map is a bijection from bytes to 256 characters; printable Latin-1 bytes map
//! to themselves, the others to U+0100 onwards in byte order.

/// The character byte `b` is written as.
pub const fn byte_char(b: u8) -> char {
    let keep = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if keep {
        return b as char;
    }
    // The n-th byte outside the kept ranges (in byte order) becomes U+0100 + n.
    let n = if b < b'!' {
        b as u32
    } else if b < 0xA1 {
        // 0x7F..=0xA0: after the 33 bytes below '!'.
        33 + (b as u32 - 0x7F)
    } else {
        // 0xAD: after 33 + 34.
        67
    };
    match char::from_u32(0x100 + n) {
        Some(c) => c,
        None => '\u{100}', // unreachable: 0x100 + n is at most 0x143
    }
}

/// Appends `text`'s bytes, each as its byte-level character, to `out`.
pub fn push_byte_level(text: &str, out: &mut String) {
    for &b in text.as_bytes() {
        out.push(byte_char(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_gpt2s_table() {
        // GPT-2's bytes_to_unicode, written out as in its encoder.py.
        let mut keep: Vec<u32> = (u32::from(b'!')..=u32::from(b'~')).collect();
        keep.extend(0xA1..=0xAC);
        keep.extend(0xAE..=0xFF);
        let mut n = 0;
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let want = if keep.contains(&u32::from(b)) {
                u32::from(b)
            } else {
                n += 1;
                0x100 + n - 1
            };
            assert_eq!(byte_char(b) as u32, want, "byte {b:#x}");
            assert!(seen.insert(byte_char(b)));
        }
        let mut s = String::new();
        push_byte_level(" h\u{e9}\n", &mut s);
        assert_eq!(s, "\u{120}h\u{c3}\u{a9}\u{10a}");
    }
}
