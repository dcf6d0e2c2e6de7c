//! The one error enum of poot-kv.

/// Everything the KV pool and block tables refuse. Running out of blocks is not an error:
/// `allocate` answers None and the scheduler preempts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// A pool setting is outside what the pool can address.
    #[error("invalid KV pool config: {what} = {value} ({why})")]
    InvalidConfig {
        what: &'static str,
        value: usize,
        why: &'static str,
    },
    /// The KV heads cannot be divided into that many equal groups.
    #[error("{n_kv_heads} KV heads cannot be divided into {head_groups} equal groups")]
    InvalidLayout {
        n_kv_heads: usize,
        head_groups: usize,
    },
    /// A block id outside the pool.
    #[error("block {block} is outside a pool of {num_blocks} blocks")]
    UnknownBlock { block: u32, num_blocks: usize },
    /// The null block (id 0) is never handed out, freed, touched or cached.
    #[error("the null block (id 0) is never handed out, freed, touched or cached")]
    NullBlock,
    /// Freeing a block nobody holds.
    #[error("double free of block {block}")]
    DoubleFree { block: u32 },
    /// An operation that needs a held block got a free one.
    #[error("block {block} is not held by any sequence")]
    NotInUse { block: u32 },
    /// Caching a block that is not full.
    #[error("a full block holds {block_size} tokens; got {got}")]
    NotFull { block_size: usize, got: usize },
    /// Caching a block that already holds a different hash.
    #[error("block {block} already holds a different hash")]
    HashConflict { block: u32 },
    /// A block table needed blocks the pool did not have.
    #[error("{needed} free blocks needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize },
}
