//! poot-formats (being written).
