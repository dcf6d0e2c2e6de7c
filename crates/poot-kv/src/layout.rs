//! Dividing the KV pool by KV heads, for models split across devices by head groups.
//!
//! One block id names the same `block_size` token slots in every group: group `g` stores, per
//! layer, a K and a V slice `[num_blocks, block_size, heads_per_group, head_dim]` holding KV
//! heads `g * heads_per_group .. (g + 1) * heads_per_group`. Allocation, ref counts, hashes and
//! eviction are decided once, by the one `BlockPool`, so every group sees the same block tables
//! and slot mapping; a group's device only needs its own slice's size
//! ([`KvLayout::group_elements_per_block`]) to size its buffer. An undivided pool is one group.

use std::ops::Range;

use crate::KvError;

/// How the KV heads are divided into groups (one per device of a tensor group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// KV heads of the model.
    pub n_kv_heads: usize,
    /// Groups the heads are divided into; divides `n_kv_heads`.
    pub head_groups: usize,
}

impl KvLayout {
    /// A layout of `head_groups` equal groups of `n_kv_heads`.
    ///
    /// # Errors
    /// [`KvError::InvalidLayout`] when either is 0 or `head_groups` does not divide `n_kv_heads`.
    pub fn new(n_kv_heads: usize, head_groups: usize) -> Result<Self, KvError> {
        if n_kv_heads == 0 || head_groups == 0 || !n_kv_heads.is_multiple_of(head_groups) {
            return Err(KvError::InvalidLayout {
                n_kv_heads,
                head_groups,
            });
        }
        Ok(Self {
            n_kv_heads,
            head_groups,
        })
    }

    /// All heads in one group.
    pub fn undivided(n_kv_heads: usize) -> Result<Self, KvError> {
        Self::new(n_kv_heads, 1)
    }

    /// KV heads in each group.
    pub fn heads_per_group(&self) -> usize {
        self.n_kv_heads / self.head_groups
    }

    /// The KV heads group `group` holds, or None past the last group.
    pub fn group_heads(&self, group: usize) -> Option<Range<usize>> {
        (group < self.head_groups).then(|| {
            let n = self.heads_per_group();
            group * n..(group + 1) * n
        })
    }

    /// The group holding KV head `head`, or None past the last head.
    pub fn group_of_head(&self, head: usize) -> Option<usize> {
        (head < self.n_kv_heads).then(|| head / self.heads_per_group())
    }

    /// Elements of one block in one group's K (or V) slice of one layer.
    pub fn group_elements_per_block(&self, block_size: usize, head_dim: usize) -> usize {
        block_size * self.heads_per_group() * head_dim
    }

    /// Elements of one block's K (or V) in one layer across all groups.
    pub fn elements_per_block(&self, block_size: usize, head_dim: usize) -> usize {
        block_size * self.n_kv_heads * head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_partition_the_heads() {
        let l = KvLayout::new(8, 4).unwrap();
        assert_eq!(l.heads_per_group(), 2);
        let all: Vec<usize> = (0..4).flat_map(|g| l.group_heads(g).unwrap()).collect();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        assert_eq!(l.group_heads(4), None);
        assert_eq!(l.group_of_head(5), Some(2));
        assert_eq!(l.group_of_head(8), None);
        assert_eq!(
            l.group_elements_per_block(16, 64) * 4,
            l.elements_per_block(16, 64)
        );
    }

    #[test]
    fn uneven_division_is_refused() {
        assert!(matches!(
            KvLayout::new(6, 4),
            Err(KvError::InvalidLayout { .. })
        ));
        assert!(KvLayout::new(0, 1).is_err());
        assert!(KvLayout::new(4, 0).is_err());
        assert_eq!(KvLayout::undivided(3).unwrap().heads_per_group(), 3);
    }
}
