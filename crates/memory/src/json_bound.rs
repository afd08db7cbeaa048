//! A cheap upper bound of a value's JSON length, for size checks: most records are far
//! below the limit, and bounding them walks the value without formatting numbers or
//! escaping strings. Only a value whose bound exceeds the limit is measured exactly.

use std::fmt;

use serde::Serialize;
use serde::ser;

/// The bound of `value`'s JSON length, or `None` when the bound cannot be given (a map key
/// JSON may refuse): the caller then measures exactly, which also reports such errors.
#[cfg(test)]
pub(crate) fn json_len_bound<T: Serialize + ?Sized>(value: &T) -> Option<usize> {
    json_len_and_depth(value).map(|(len, _)| len)
}

/// A cheap upper bound of a value's JSON length (see the module), and how deeply the value
/// nests: its arrays and objects inside one another, counting an enum variant's wrapping
/// object, as JSON does (a scalar is 0). `None` for a value the bound gives up on.
pub(crate) fn json_len_and_depth<T: Serialize + ?Sized>(value: &T) -> Option<(usize, usize)> {
    let mut bound = Bound { len: 0, in_key: false, depth: 0, deepest: 0 };
    value.serialize(&mut bound).ok()?;
    Some((bound.len, bound.deepest))
}

/// Quotes, and every byte escaped at its longest (`\u00XX`).
const fn string(len: usize) -> usize {
    2 + 6 * len
}

/// The longest integer, float and 128-bit integer forms (with quotes, as map keys).
const INTEGER: usize = 22;
const FLOAT: usize = 27;
const WIDE: usize = 42;

struct Bound {
    len: usize,
    /// Serializing a map key: only what JSON accepts as a key is bounded.
    in_key: bool,
    /// The arrays and objects open around what is being serialized.
    depth: usize,
    /// The most that were open at once.
    deepest: usize,
}

#[derive(Debug)]
struct Unbounded;

impl fmt::Display for Unbounded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a JSON map key")
    }
}

impl std::error::Error for Unbounded {}

impl ser::Error for Unbounded {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Self
    }
}

impl Bound {
    fn add(&mut self, len: usize) -> Result<(), Unbounded> {
        self.len = self.len.saturating_add(len);
        Ok(())
    }

    /// Adds a compound value's opening and closing, refused as a map key.
    fn open(&mut self, len: usize) -> Result<&mut Self, Unbounded> {
        if self.in_key {
            return Err(Unbounded);
        }
        self.add(len)?;
        Ok(self)
    }

    /// Opens `levels` of nesting (an array or object; a variant's wrapping object too).
    fn enter(&mut self, levels: usize) -> &mut Self {
        self.depth += levels;
        self.deepest = self.deepest.max(self.depth);
        self
    }

    /// Closes what [`Bound::enter`] opened.
    fn leave(&mut self, levels: usize) -> Result<(), Unbounded> {
        self.depth = self.depth.saturating_sub(levels);
        Ok(())
    }
}

/// Scalars whose longest JSON form has a fixed width.
macro_rules! fixed_width {
    ($($method:ident: $type:ty => $width:expr),*) => {$(
        fn $method(self, _: $type) -> Result<(), Unbounded> {
            self.add($width)
        }
    )*};
}

impl<'a> ser::Serializer for &'a mut Bound {
    type Ok = ();
    type Error = Unbounded;
    type SerializeSeq = &'a mut Bound;
    type SerializeTuple = &'a mut Bound;
    type SerializeTupleStruct = &'a mut Bound;
    type SerializeTupleVariant = &'a mut Bound;
    type SerializeMap = &'a mut Bound;
    type SerializeStruct = &'a mut Bound;
    type SerializeStructVariant = &'a mut Bound;

    fixed_width!(
        serialize_bool: bool => 7,
        serialize_i8: i8 => INTEGER,
        serialize_i16: i16 => INTEGER,
        serialize_i32: i32 => INTEGER,
        serialize_i64: i64 => INTEGER,
        serialize_i128: i128 => WIDE,
        serialize_u8: u8 => INTEGER,
        serialize_u16: u16 => INTEGER,
        serialize_u32: u32 => INTEGER,
        serialize_u64: u64 => INTEGER,
        serialize_u128: u128 => WIDE
    );
    fn serialize_f32(self, value: f32) -> Result<(), Unbounded> {
        self.serialize_f64(f64::from(value))
    }
    fn serialize_f64(self, value: f64) -> Result<(), Unbounded> {
        // JSON refuses a key that is not a finite number (a value becomes `null`).
        if self.in_key && !value.is_finite() {
            return Err(Unbounded);
        }
        self.add(FLOAT)
    }
    fn serialize_char(self, value: char) -> Result<(), Unbounded> {
        self.add(string(value.len_utf8()))
    }
    fn serialize_str(self, value: &str) -> Result<(), Unbounded> {
        self.add(string(value.len()))
    }
    fn serialize_bytes(self, value: &[u8]) -> Result<(), Unbounded> {
        // An array of numbers: at most `255,` a byte.
        self.open(2)?.enter(1).add(4 * value.len())?;
        self.leave(1)
    }
    fn serialize_none(self) -> Result<(), Unbounded> {
        self.open(4).map(drop)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Unbounded> {
        if self.in_key {
            return Err(Unbounded);
        }
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Unbounded> {
        self.open(4).map(drop)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Unbounded> {
        self.open(4).map(drop)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<(), Unbounded> {
        self.add(string(variant.len()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Unbounded> {
        // An id or a timestamp: ASCII text of a bounded length, counted unformatted.
        if name == agentry_types::FIXED_TEXT {
            return self.add(2 + agentry_types::FIXED_TEXT_MAX_LEN);
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Unbounded> {
        let wrapped = self.open(3 + string(variant.len()))?.enter(1);
        value.serialize(&mut *wrapped)?;
        wrapped.leave(1)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self, Unbounded> {
        Ok(self.open(2)?.enter(1))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, Unbounded> {
        Ok(self.open(2)?.enter(1))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, Unbounded> {
        Ok(self.open(2)?.enter(1))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self, Unbounded> {
        Ok(self.open(5 + string(variant.len()))?.enter(2))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, Unbounded> {
        Ok(self.open(2)?.enter(1))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Unbounded> {
        Ok(self.open(2)?.enter(1))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Self, Unbounded> {
        Ok(self.open(5 + string(variant.len()))?.enter(2))
    }
}

/// Elements: a comma each, then the element.
macro_rules! elements {
    ($($trait:ident :: $method:ident => $levels:expr),*) => {$(
        impl ser::$trait for &mut Bound {
            type Ok = ();
            type Error = Unbounded;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unbounded> {
                self.add(1)?;
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), Unbounded> {
                self.leave($levels)
            }
        }
    )*};
}

elements!(
    SerializeSeq::serialize_element => 1,
    SerializeTuple::serialize_element => 1,
    SerializeTupleStruct::serialize_field => 1,
    SerializeTupleVariant::serialize_field => 2
);

impl ser::SerializeMap for &mut Bound {
    type Ok = ();
    type Error = Unbounded;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Unbounded> {
        // A comma; a key JSON writes unquoted (a number) gets quotes, counted in its bound.
        self.add(1)?;
        self.in_key = true;
        let bounded = key.serialize(&mut **self);
        self.in_key = false;
        bounded
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unbounded> {
        self.add(1)?;
        value.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Unbounded> {
        self.leave(1)
    }
}

/// Struct fields: a comma, the quoted name and a colon, then the value.
macro_rules! fields {
    ($($trait:ident => $levels:expr),*) => {$(
        impl ser::$trait for &mut Bound {
            type Ok = ();
            type Error = Unbounded;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Unbounded> {
                self.add(2 + string(key.len()))?;
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<(), Unbounded> {
                self.leave($levels)
            }
        }
    )*};
}

fields!(SerializeStruct => 1, SerializeStructVariant => 2);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::{json_len_and_depth, json_len_bound};

    fn exact<T: serde::Serialize>(value: &T) -> usize {
        serde_json::to_vec(value).unwrap().len()
    }

    #[test]
    fn bounds_are_never_below_the_json_length() {
        #[derive(serde::Serialize)]
        enum Shape {
            Unit,
            New(u8),
            Tuple(i64, f64),
            Named { text: String, bytes: Vec<u8> },
        }
        #[derive(serde::Serialize)]
        struct All {
            flag: bool,
            wide: u128,
            none: Option<u8>,
            some: Option<&'static str>,
            shapes: Vec<Shape>,
            keys: BTreeMap<u32, char>,
            quotes: &'static str,
            control: &'static str,
        }
        let all = All {
            flag: false,
            wide: u128::MAX,
            none: None,
            some: Some("é\u{1F600}"),
            shapes: vec![
                Shape::Unit,
                Shape::New(255),
                Shape::Tuple(i64::MIN, -1.234_567_890_123_456_7e-300),
                Shape::Named { text: "\"\\\n".into(), bytes: vec![255, 0, 17] },
            ],
            keys: [(u32::MAX, '"'), (0, '\u{0}')].into_iter().collect(),
            quotes: "\"\"\"",
            control: "\u{1}\u{1f}",
        };
        assert!(json_len_bound(&all).unwrap() >= exact(&all));
    }

    #[test]
    fn ids_and_timestamps_are_bounded_without_being_formatted_and_never_below_their_json() {
        use agentry_types::{SessionId, Timestamp, TurnId};
        let stamps = [Timestamp::now(), Timestamp::from_unix_micros(i64::MIN), Timestamp::MAX];
        let ids: BTreeMap<TurnId, (SessionId, Timestamp)> =
            stamps.iter().map(|stamp| (TurnId::new(), (SessionId::new(), *stamp))).collect();
        let (bound, json) = (json_len_bound(&ids).unwrap(), exact(&ids));
        assert!(bound >= json, "{bound} < {json}");
        // Counted at the fixed length, not at the six bytes a character of any string gets.
        assert!(bound < 2 * json, "{bound} is far above {json}");
        for stamp in stamps {
            assert!(json_len_bound(&stamp).unwrap() >= exact(&stamp));
        }
    }

    #[test]
    fn a_key_json_refuses_gives_no_bound() {
        let map: BTreeMap<Vec<u8>, u8> = [(vec![1], 1)].into_iter().collect();
        assert!(serde_json::to_vec(&map).is_err());
        assert_eq!(json_len_bound(&map), None);
        // A map keyed by a float: JSON takes finite ones only.
        struct FloatKeyed(f64);
        impl serde::Serialize for FloatKeyed {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap as _;
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry(&self.0, &1)?;
                map.end()
            }
        }
        assert!(json_len_bound(&FloatKeyed(-1.5e-300)).unwrap() >= exact(&FloatKeyed(-1.5e-300)));
        assert!(serde_json::to_vec(&FloatKeyed(f64::INFINITY)).is_err());
        assert_eq!(json_len_bound(&FloatKeyed(f64::INFINITY)), None);
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            ".{0,12}".prop_map(Value::from),
            "[\\x00-\\x1f\"\\\\]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// How deeply a JSON value nests its arrays and objects.
    fn nesting(value: &Value) -> usize {
        match value {
            Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
            Value::Object(map) => 1 + map.values().map(nesting).max().unwrap_or(0),
            _ => 0,
        }
    }

    proptest! {
        #[test]
        fn the_bound_of_any_json_value_covers_its_length(value in json()) {
            let bound = json_len_bound(&value).unwrap();
            prop_assert!(bound >= exact(&value), "bound {} below {} for {}", bound, exact(&value), value);
        }

        #[test]
        fn the_depth_of_any_json_value_is_its_nesting(value in json()) {
            prop_assert_eq!(json_len_and_depth(&value).unwrap().1, nesting(&value));
        }
    }

    #[test]
    fn the_depth_counts_structs_variants_and_bytes_and_closes_each() {
        #[derive(serde::Serialize)]
        enum Shape {
            Unit,
            New(Vec<u8>),
            Tuple(u8, Vec<u8>),
            Named { inner: Vec<Vec<u8>> },
        }
        let depth = |value: &Shape| json_len_and_depth(value).unwrap().1;
        assert_eq!(depth(&Shape::Unit), 0);
        // `{"New":[..]}`, `{"Tuple":[1,[..]]}`, `{"Named":{"inner":[[..]]}}`.
        assert_eq!(depth(&Shape::New(vec![1])), 2);
        assert_eq!(depth(&Shape::Tuple(1, vec![1])), 3);
        assert_eq!(depth(&Shape::Named { inner: vec![vec![1]] }), 4);
        // Siblings do not add up: each closes what it opened.
        let siblings =
            vec![Shape::Named { inner: vec![vec![1]] }, Shape::Tuple(1, vec![]), Shape::New(vec![])];
        assert_eq!(json_len_and_depth(&siblings).unwrap().1, 5);
        let deep = (0..200).fold(json!(null), |inner, _| json!([inner]));
        assert_eq!(json_len_and_depth(&deep).unwrap().1, 200);
        // As deep as the JSON serde_json writes for the same values.
        for shape in
            [Shape::Unit, Shape::New(vec![1]), Shape::Tuple(1, vec![]), Shape::Named { inner: vec![vec![]] }]
        {
            assert_eq!(depth(&shape), nesting(&serde_json::to_value(&shape).unwrap()));
        }
        assert_eq!(
            json_len_and_depth(&siblings).unwrap().1,
            nesting(&serde_json::to_value(&siblings).unwrap())
        );
    }

    #[test]
    fn small_records_are_bounded_well_below_the_limit() {
        let value = json!({"role": "assistant", "content": "The answer is 42.", "tool_calls": []});
        let bound = json_len_bound(&value).unwrap();
        assert!(bound < 40 * exact(&value));
    }
}
