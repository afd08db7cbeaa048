//! An incremental parser of `text/event-stream` bodies that yields each event's data.
//!
//! It follows the HTML server-sent events grammar: lines end with CRLF, LF or a lone CR;
//! a blank line dispatches the event; `data` fields (with or without a space after the
//! colon) are joined with `\n`; lines starting with `:` are comments; `id`, `retry` and
//! unknown fields are ignored. An event named `error` (`event: error`, as some proxies
//! send), and an `error` field (llama.cpp's server writes `error: {…}` in place of `data`),
//! are marked as errors. Bytes may arrive split anywhere, even inside a
//! line terminator or a multi-byte character.

/// The largest event the parser buffers; a larger one is a broken stream, not a response.
pub(crate) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Why the parser gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventTooLarge;

/// Turns body bytes into event data, keeping what is incomplete until more bytes come.
/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// Its data lines, joined with `\n`.
    pub(crate) data: String,
    /// Whether the server marked it as an error (see the module's documentation).
    pub(crate) error: bool,
}

#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// The pending event is marked as an error.
    error: bool,
    /// The bytes of the current, unterminated line.
    line: Vec<u8>,
    /// The data of the current event so far.
    data: Vec<u8>,
    /// Whether the current event has a `data` field (an empty one counts).
    has_data: bool,
    /// Whether the last byte was a CR, so that an LF right after it ends nothing.
    after_cr: bool,
}

impl SseParser {
    /// Feeds body bytes and appends the data of every event they complete to `events`.
    pub(crate) fn push(&mut self, bytes: &[u8], events: &mut Vec<SseEvent>) -> Result<(), EventTooLarge> {
        let mut rest = bytes;
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if let Some(after_lf) = rest.strip_prefix(b"\n") {
                rest = after_lf;
            }
        }
        while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&rest[..end]);
            self.check_size()?;
            self.end_line(events);
            if rest[end] == b'\r' {
                match rest.get(end + 1) {
                    Some(b'\n') => rest = &rest[end + 2..],
                    Some(_) => rest = &rest[end + 1..],
                    None => {
                        self.after_cr = true;
                        rest = &[];
                    }
                }
            } else {
                rest = &rest[end + 1..];
            }
        }
        self.line.extend_from_slice(rest);
        self.check_size()
    }

    /// Ends the body: an unterminated last line and an undispatched last event still
    /// count, since some servers close the connection right after their last `data` line.
    pub(crate) fn finish(&mut self, events: &mut Vec<SseEvent>) {
        if !self.line.is_empty() {
            self.end_line(events);
        }
        self.dispatch(events);
    }

    fn check_size(&self) -> Result<(), EventTooLarge> {
        if self.line.len() + self.data.len() > MAX_EVENT_BYTES { Err(EventTooLarge) } else { Ok(()) }
    }

    fn end_line(&mut self, events: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(events);
            return;
        }
        if line.starts_with(b":") {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (&line[..], &[][..]),
        };
        if field == b"event" {
            self.error = value == b"error";
        } else if field == b"error" {
            self.error = true;
        }
        if field == b"data" || field == b"error" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
    }

    fn dispatch(&mut self, events: &mut Vec<SseEvent>) {
        let error = std::mem::take(&mut self.error);
        if std::mem::take(&mut self.has_data) {
            let data = std::mem::take(&mut self.data);
            let data = String::from_utf8(data)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            events.push(SseEvent { data, error });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(body: &[u8], piece: usize) -> Vec<String> {
        events_in_pieces(body, piece).into_iter().map(|event| event.data).collect()
    }

    fn events_in_pieces(body: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for chunk in body.chunks(piece.max(1)) {
            parser.push(chunk, &mut events).unwrap();
        }
        parser.finish(&mut events);
        events
    }

    #[test]
    fn data_fields_are_read_with_or_without_a_space_and_other_fields_are_ignored() {
        let body = b": keep-alive\nevent: message\nid: 7\nretry: 100\ndata: {\"a\":1}\n\ndata:{\"b\":2}\n\n";
        assert_eq!(parse_in_pieces(body, usize::MAX), ["{\"a\":1}", "{\"b\":2}"]);
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        let body = b"data: first\ndata:second\ndata\n\n";
        assert_eq!(parse_in_pieces(body, usize::MAX), ["first\nsecond\n"]);
    }

    #[test]
    fn every_split_point_and_every_line_ending_give_the_same_events() {
        let lf = String::from("data: {\"text\":\"h\u{e9}llo \u{1f600}\"}\n\n: comment\ndata: [DONE]\n\n");
        let crlf = lf.replace('\n', "\r\n");
        let cr = lf.replace('\n', "\r");
        let expected = ["{\"text\":\"h\u{e9}llo \u{1f600}\"}", "[DONE]"];
        for body in [lf.as_str(), crlf.as_str(), cr.as_str()] {
            for piece in 1..=body.len() {
                assert_eq!(parse_in_pieces(body.as_bytes(), piece), expected, "piece size {piece}");
            }
        }
    }

    #[test]
    fn a_last_event_without_a_blank_line_is_still_delivered() {
        assert_eq!(parse_in_pieces(b"data: one\n\ndata: [DONE]", usize::MAX), ["one", "[DONE]"]);
        assert_eq!(parse_in_pieces(b"data: one\n\n: only a comment\n", usize::MAX), ["one"]);
    }

    #[test]
    fn an_event_larger_than_the_limit_is_refused() {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        parser.push(b"data: ", &mut events).unwrap();
        let big = vec![b'x'; MAX_EVENT_BYTES];
        assert_eq!(parser.push(&big, &mut events), Err(EventTooLarge));
    }

    #[test]
    fn error_events_and_llama_cpp_error_fields_are_marked() {
        let body =
            b"event: error\ndata: {\"message\":\"Overloaded\"}\n\nerror: {\"code\":400}\n\ndata: {}\n\n";
        let events = events_in_pieces(body, 3);
        let marked: Vec<(&str, bool)> =
            events.iter().map(|event| (event.data.as_str(), event.error)).collect();
        assert_eq!(marked, [("{\"message\":\"Overloaded\"}", true), ("{\"code\":400}", true), ("{}", false)]);
    }
}
