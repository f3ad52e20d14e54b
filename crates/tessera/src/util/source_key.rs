//! How keys of per-source objects (rewrite history, PFC state, lifecycle
//! lineages) name a source lineage.

/// A source lineage's name as lower-case hex of its UTF-8 bytes.
pub fn source_hex(source: &str) -> String {
    source.bytes().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_hex_of_the_utf8_bytes() {
        assert_eq!(super::source_hex("a/é"), "612fc3a9");
        assert_eq!(super::source_hex(""), "");
    }
}
