//! The hash both tables use: word-at-a-time multiply-xor over the bytes, then a full 64-bit
//! mix, so the low bits (which pick a slot) depend on every input byte.

const K: u64 = 0x517c_c1b7_2722_0a95;

/// splitmix64's finalizer.
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A hash of `bytes`.
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    mix(h)
}

/// A `Hasher` for `u64` keys (merge pairs): the key mixed once.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PairHasher(u64);

impl std::hash::Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 ^= hash_bytes(bytes);
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = mix(x ^ self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_bits_depend_on_every_byte() {
        let a = hash_bytes(b"abcdefgh_1");
        let b = hash_bytes(b"abcdefgh_2");
        let c = hash_bytes(b"bbcdefgh_1");
        assert_ne!(a & 0xffff, b & 0xffff);
        assert_ne!(a & 0xffff, c & 0xffff);
        assert_ne!(hash_bytes(b"a"), hash_bytes(b"a\0"));
        assert_ne!(mix(1 << 32) & 0xffff, mix(2 << 32) & 0xffff);
    }
}
