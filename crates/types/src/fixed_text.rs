//! The serde form of ids and timestamps: short ASCII text of a bounded length.
//!
//! They serialize as a newtype struct named [`FIXED_TEXT`] around their text. JSON
//! serializers (serde_json's among them) write a newtype struct as its inner value, so the
//! JSON is the plain string; a serializer that only bounds a value's length (the stores'
//! size checks) can recognise the name and count [`FIXED_TEXT_MAX_LEN`] bytes without
//! formatting the text, which is most of the cost of bounding a record. A serializer that
//! does not know the name passes the newtype through, so nothing else sees a difference.

use serde::{Serialize, Serializer};

/// The newtype-struct name under which ids and timestamps serialize their text.
pub const FIXED_TEXT: &str = "$agentry::FixedText";

/// The longest text serialized under [`FIXED_TEXT`], in bytes: printable ASCII that JSON
/// writes without escapes. A timestamp of the farthest year an `i64` of microseconds
/// reaches, `-292277-01-10T04:00:54.775808Z`, is 30; an id is 36.
pub const FIXED_TEXT_MAX_LEN: usize = 36;

/// Serializes `text` under [`FIXED_TEXT`]: `text` serializes as a string of at most
/// [`FIXED_TEXT_MAX_LEN`] bytes of printable ASCII, formatted only when a serializer asks.
pub(crate) fn serialize_fixed<S: Serializer, T: Serialize + ?Sized>(
    serializer: S,
    text: &T,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_newtype_struct(FIXED_TEXT, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_text_is_written_to_json_as_a_plain_string() {
        struct Fixed;
        impl Serialize for Fixed {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serialize_fixed(serializer, "2026-11-27T02:08:59.123456Z")
            }
        }
        assert_eq!(serde_json::to_string(&Fixed).unwrap(), "\"2026-11-27T02:08:59.123456Z\"");
        assert_eq!(serde_json::to_value(&Fixed).unwrap(), serde_json::json!("2026-11-27T02:08:59.123456Z"));
    }

    #[test]
    fn the_farthest_timestamps_and_ids_fit_the_fixed_length() {
        for micros in [i64::MIN, i64::MAX, 0] {
            let timestamp = crate::Timestamp::from_unix_micros(micros);
            let json = serde_json::to_string(&timestamp).unwrap();
            assert!(json.len() - 2 <= FIXED_TEXT_MAX_LEN, "{json}");
            assert!(json.bytes().all(|byte| byte.is_ascii_graphic()), "{json}");
            assert_eq!(json, format!("\"{}\"", timestamp.to_rfc3339()));
        }
        let id = serde_json::to_string(&crate::TurnId::new()).unwrap();
        assert_eq!(id.len() - 2, FIXED_TEXT_MAX_LEN, "{id}");
    }
}
