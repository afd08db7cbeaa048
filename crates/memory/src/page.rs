//! Pagination: orders, page requests, pages and opaque page tokens.
//!
//! A page token encodes the key of the last item of the previous page and the kind of
//! listing it belongs to, so a token cannot be replayed against another listing.

use base64::Engine as _;

use crate::error::{StoreError, StoreResult};

/// The order of a listing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Order {
    /// Oldest first.
    #[default]
    Asc,
    /// Newest first.
    Desc,
}

/// The largest page a store returns; larger requests are capped.
pub const MAX_PAGE: usize = 1000;

/// Which page to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageRequest {
    /// The token of the previous page's end; none for the first page.
    pub token: Option<String>,
    /// At most this many items (capped at [`MAX_PAGE`]; 0 means the default of 100).
    pub limit: usize,
}

impl PageRequest {
    /// The first page of up to `limit` items.
    #[must_use]
    pub const fn first(limit: usize) -> Self {
        Self { token: None, limit }
    }

    /// The page after `token`.
    #[must_use]
    pub fn after(token: impl Into<String>, limit: usize) -> Self {
        Self { token: Some(token.into()), limit }
    }

    /// The limit, defaulted and capped.
    #[must_use]
    pub fn effective_limit(&self) -> usize {
        match self.limit {
            0 => 100,
            limit => limit.min(MAX_PAGE),
        }
    }
}

/// A page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// The token for the next page; none when this is the last.
    pub next_token: Option<String>,
}

impl<T> Page<T> {
    /// A page from items read with one extra lookahead item: when `items` holds more than
    /// `limit`, the extra is dropped and a token for the last kept item is issued.
    pub fn from_lookahead(mut items: Vec<T>, limit: usize, kind: &str, key: impl Fn(&T) -> String) -> Self {
        let next_token = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|last| encode_token(kind, &key(last)))
        } else {
            None
        };
        Self { items, next_token }
    }
}

/// Encodes a page token for a key of a listing kind.
#[must_use]
pub fn encode_token(kind: &str, key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("v1|{kind}|{key}"))
}

/// Decodes a page token issued for `kind`; returns the key. A token that was not issued
/// by [`encode_token`] for this kind is an invalid input.
pub fn decode_token(kind: &str, token: &str) -> StoreResult<String> {
    let shown = shown(token);
    let invalid = || {
        StoreError::InvalidInput(format!(
            "invalid page token {shown}: it is not a page token (pass a page's next_token as given)"
        ))
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let mut parts = text.splitn(3, '|');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some(found), Some(key)) if found == kind => Ok(key.to_owned()),
        (Some("v1"), Some(_), Some(_)) => Err(StoreError::InvalidInput(format!(
            "invalid page token {shown}: it belongs to another listing (another filter, order or session); \
             a token continues only the listing that gave it"
        ))),
        _ => Err(invalid()),
    }
}

/// The listing kind of a session's runs in an order: a token of one session's listing (or
/// of the other order) is refused by another.
#[must_use]
pub fn runs_kind(session: agentry_types::SessionId, order: Order) -> String {
    let order = match order {
        Order::Asc => "asc",
        Order::Desc => "desc",
    };
    format!("runs:{session}:{order}")
}

/// Decodes a request's token into a parsed key.
pub fn decode_key<K: std::str::FromStr>(kind: &str, request: &PageRequest) -> StoreResult<Option<K>> {
    let Some(token) = &request.token else { return Ok(None) };
    let key = decode_token(kind, token)?;
    key.parse()
        .map(Some)
        .map_err(|_| StoreError::InvalidInput(format!("invalid page token {}", shown(token))))
}

/// The most of a token an error message quotes: a token is a few dozen bytes, and one
/// sent wrong can be any size.
const MAX_SHOWN_TOKEN: usize = 80;

/// A token as an error message quotes it: whole when short, else its start and its length.
fn shown(token: &str) -> String {
    if token.len() <= MAX_SHOWN_TOKEN {
        return format!("{token:?}");
    }
    let mut end = MAX_SHOWN_TOKEN;
    while !token.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &token[..end], token.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_quotes_a_long_token_cut() {
        let token = "é".repeat(5_000);
        let Err(StoreError::InvalidInput(message)) = decode_token("sessions", &token) else {
            panic!("a long token that is not a page token was accepted");
        };
        assert!(message.len() < 300, "{message}");
        assert!(message.contains("(10000 bytes)") && message.contains("not a page token"), "{message}");
        let short = decode_token("sessions", "abc").unwrap_err().to_string();
        assert!(short.contains("\"abc\""), "{short}");
    }
}
