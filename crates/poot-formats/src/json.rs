//! Streaming JSON visitors for safetensors headers and sharded-checkpoint indexes.
//!
//! Invariants: objects are read in document order and duplicate keys are kept (the callers
//! report them as `DuplicateName`, which serde's maps would silently drop); a shape holds at most
//! [`MAX_RANK`] dimensions and `data_offsets` exactly two, so memory stays a small multiple of
//! the JSON text. While parsing, [`Ctx`] records the tensor and field being read, so a JSON
//! error can name them. Unknown keys inside a tensor entry are ignored, as safetensors does.

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Most dimensions a safetensors tensor may have.
pub const MAX_RANK: usize = 64;
/// The key of the free-form string metadata in a safetensors header.
pub const METADATA_KEY: &str = "__metadata__";

/// What the parser was reading when it stopped, for error messages.
#[derive(Debug, Default)]
pub struct Ctx {
    /// The top-level key being read (a tensor name or `__metadata__`).
    pub key: RefCell<Option<String>>,
    /// The field inside that entry.
    pub field: Cell<&'static str>,
}

/// One tensor entry as written in the header, before validation.
#[derive(Debug)]
pub struct RawTensor {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub data_offsets: [u64; 2],
}

/// One top-level entry of a safetensors header.
#[derive(Debug)]
pub enum Entry {
    Metadata(Vec<(String, String)>),
    Tensor(RawTensor),
}

/// The top-level object of a safetensors header, in document order.
pub struct HeaderSeed<'c>(pub &'c Ctx);

impl<'de> DeserializeSeed<'de> for HeaderSeed<'_> {
    type Value = Vec<(String, Entry)>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_> {
    type Value = Vec<(String, Entry)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a safetensors header object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            *self.0.key.borrow_mut() = Some(key.clone());
            self.0.field.set("");
            let entry = if key == METADATA_KEY {
                self.0.field.set(METADATA_KEY);
                Entry::Metadata(map.next_value_seed(StringMap)?)
            } else {
                Entry::Tensor(map.next_value_seed(TensorSeed(self.0))?)
            };
            out.push((key, entry));
            // Between entries, an error belongs to the header, not to the entry just read.
            *self.0.key.borrow_mut() = None;
            self.0.field.set("");
        }
        Ok(out)
    }
}

/// An object of strings to strings (or `null`, read as empty), in order, duplicates kept.
pub struct StringMap;

impl<'de> DeserializeSeed<'de> for StringMap {
    type Value = Vec<(String, String)>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for StringMap {
    type Value = Vec<(String, String)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of strings")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, String>()? {
            out.push((k, v));
        }
        Ok(out)
    }
}

struct TensorSeed<'c>(&'c Ctx);

impl<'de> DeserializeSeed<'de> for TensorSeed<'_> {
    type Value = RawTensor;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TensorSeed<'_> {
    type Value = RawTensor;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor entry {dtype, shape, data_offsets}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "dtype" => {
                    self.0.field.set("dtype");
                    set_once(&mut dtype, map.next_value::<String>()?, "dtype")?;
                }
                "shape" => {
                    self.0.field.set("shape");
                    set_once(
                        &mut shape,
                        map.next_value_seed(U64Seq { max: MAX_RANK })?,
                        "shape",
                    )?;
                }
                "data_offsets" => {
                    self.0.field.set("data_offsets");
                    let v = map.next_value_seed(U64Seq { max: 2 })?;
                    let pair: [u64; 2] = v.try_into().map_err(|v: Vec<u64>| {
                        de::Error::invalid_length(v.len(), &"two offsets [begin, end]")
                    })?;
                    set_once(&mut offsets, pair, "data_offsets")?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let missing = |name: &'static str| {
            self.0.field.set(name);
            de::Error::missing_field(name)
        };
        Ok(RawTensor {
            dtype: dtype.ok_or_else(|| missing("dtype"))?,
            shape: shape.ok_or_else(|| missing("shape"))?,
            data_offsets: offsets.ok_or_else(|| missing("data_offsets"))?,
        })
    }
}

fn set_once<T, E: de::Error>(slot: &mut Option<T>, v: T, name: &'static str) -> Result<(), E> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(v);
    Ok(())
}

/// An array of at most `max` unsigned integers.
struct U64Seq {
    max: usize,
}

impl<'de> DeserializeSeed<'de> for U64Seq {
    type Value = Vec<u64>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for U64Seq {
    type Value = Vec<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an array of at most {} unsigned integers", self.max)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(x) = seq.next_element::<u64>()? {
            if out.len() == self.max {
                return Err(de::Error::invalid_length(self.max + 1, &self));
            }
            out.push(x);
        }
        Ok(out)
    }
}

/// A sharded checkpoint's index: the `weight_map` in order (duplicates kept); the rest ignored.
pub struct IndexSeed<'c>(pub &'c Ctx);

impl<'de> DeserializeSeed<'de> for IndexSeed<'_> {
    type Value = Vec<(String, String)>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IndexSeed<'_> {
    type Value = Vec<(String, String)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an index object with a weight_map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut weight_map = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "weight_map" {
                self.0.field.set("weight_map");
                set_once(
                    &mut weight_map,
                    map.next_value_seed(StringMap)?,
                    "weight_map",
                )?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        self.0.field.set("weight_map");
        weight_map.ok_or_else(|| de::Error::missing_field("weight_map"))
    }
}
