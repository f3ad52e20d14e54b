//! The delta format (layout in the [parent module](super)): writer and decoder.

use crate::error::{Error, Result};

/// The format version this build writes and reads.
const VERSION: u8 = 1;
/// The object name in errors.
const OBJECT: &str = "delta";
/// Tag bit of an INSERT op (clear for COPY).
const INSERT: u64 = 1;

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Appends ops to a delta; zero-length ops are dropped.
pub(super) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// A delta for a target of `target_len` bytes, with its header written.
    pub(super) fn new(target_len: usize) -> Self {
        let mut buf = Vec::with_capacity(64);
        buf.push(VERSION);
        put_varint(&mut buf, target_len as u64);
        Writer { buf }
    }

    /// COPY `len` bytes of the base from `offset`.
    pub(super) fn copy(&mut self, offset: usize, len: usize) {
        if len > 0 {
            put_varint(&mut self.buf, (len as u64) << 1);
            put_varint(&mut self.buf, offset as u64);
        }
    }

    /// INSERT `bytes` literally.
    pub(super) fn insert(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            put_varint(&mut self.buf, ((bytes.len() as u64) << 1) | INSERT);
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The encoded delta.
    pub(super) fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// A cursor over the delta being decoded.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn truncated(&self, what: &str) -> Error {
        Error::corrupt(
            OBJECT,
            format!("truncated at byte {} while reading {what}", self.pos),
        )
    }

    fn varint(&mut self, what: &str) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.truncated(what));
            };
            self.pos += 1;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                break;
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::corrupt(
            OBJECT,
            format!("{what} ending at byte {} overflows 64 bits", self.pos),
        ))
    }

    fn length(&mut self, what: &str) -> Result<usize> {
        let v = self.varint(what)?;
        usize::try_from(v)
            .map_err(|_| Error::corrupt(OBJECT, format!("{what} {v} does not fit this machine")))
    }

    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8]> {
        let bytes = self
            .pos
            .checked_add(len)
            .and_then(|end| self.buf.get(self.pos..end))
            .ok_or_else(|| self.truncated(what))?;
        self.pos += len;
        Ok(bytes)
    }
}

/// Rebuilds the target from `base` and a `delta` made by
/// [`encode`](super::encode) or [`encode_with`](super::encode_with).
///
/// Every op is checked: a delta of another version, a truncated or overlong
/// varint, a zero-length op, a COPY outside the base, an INSERT beyond the
/// end of the delta, ops that overrun the declared target length or stop
/// short of it, and bytes after the last op are errors
/// ([`Error::UnsupportedVersion`] or [`Error::Corrupt`]), never panics.
pub fn decode(base: &[u8], delta: &[u8]) -> Result<Vec<u8>> {
    let mut r = Reader { buf: delta, pos: 0 };
    let version = r.take(1, "the version")?[0];
    if version != VERSION {
        return Err(Error::UnsupportedVersion {
            object: OBJECT.into(),
            found: version.into(),
            supported: VERSION.into(),
        });
    }
    let target_len = r.length("the target length")?;
    if target_len > crate::chunker::MAX_CHUNK_SIZE {
        return Err(Error::corrupt(
            OBJECT,
            format!("target length {target_len} exceeds the largest chunk (16 MiB)"),
        ));
    }
    // Ops that do not copy one base byte twice give at most base + delta
    // bytes, so a garbled target length cannot allocate much more.
    let mut out = Vec::with_capacity(target_len.min(base.len() + delta.len()));
    while r.pos < delta.len() {
        let at = out.len();
        let tag = r.varint("an op")?;
        // At most 2^63 - 1, so it fits `usize` wherever `target_len` did.
        let len = usize::try_from(tag >> 1).unwrap_or(usize::MAX);
        if len == 0 {
            return Err(Error::corrupt(
                OBJECT,
                format!("zero-length op at target offset {at}"),
            ));
        }
        if len > target_len - at {
            return Err(Error::corrupt(
                OBJECT,
                format!(
                    "op of {len} bytes at target offset {at} overruns the declared target length {target_len}"
                ),
            ));
        }
        if tag & INSERT == INSERT {
            out.extend_from_slice(r.take(len, "INSERT literal bytes")?);
        } else {
            let offset = r.length("a COPY offset")?;
            let src = offset
                .checked_add(len)
                .and_then(|end| base.get(offset..end))
                .ok_or_else(|| {
                    Error::corrupt(
                        OBJECT,
                        format!(
                            "COPY of {len} bytes from base offset {offset} (target offset {at}) is outside the {}-byte base",
                            base.len()
                        ),
                    )
                })?;
            out.extend_from_slice(src);
        }
    }
    if out.len() != target_len {
        return Err(Error::corrupt(
            OBJECT,
            format!(
                "ops end at target offset {} short of the declared target length {target_len}",
                out.len()
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn delta(target_len: u64, ops: &[&[u64]], literal: &[u8]) -> Vec<u8> {
        let mut d = vec![VERSION];
        put_varint(&mut d, target_len);
        for op in ops {
            for &v in *op {
                put_varint(&mut d, v);
            }
        }
        d.extend_from_slice(literal);
        d
    }

    fn corrupt_detail(base: &[u8], d: &[u8]) -> String {
        match decode(base, d) {
            Err(Error::Corrupt { object, detail }) if object == OBJECT => detail,
            other => panic!("expected a corrupt-delta error, got {other:?}"),
        }
    }

    #[test]
    fn ops_decode() {
        let base = b"0123456789";
        // COPY 4 from 2, INSERT "xy", COPY 1 from 9.
        let mut d = delta(7, &[&[4 << 1, 2], &[(2 << 1) | 1]], b"xy");
        put_varint(&mut d, 1 << 1);
        put_varint(&mut d, 9);
        assert_eq!(decode(base, &d).unwrap(), b"2345xy9");
        assert_eq!(decode(base, &delta(0, &[], b"")).unwrap(), b"");
        assert_eq!(decode(b"", &delta(1, &[&[3]], b"z")).unwrap(), b"z");
    }

    #[test]
    fn malformed_deltas_are_rejected() {
        let base = b"0123456789";
        assert!(corrupt_detail(base, b"").contains("truncated"));
        assert!(matches!(
            decode(base, &[2, 0]),
            Err(Error::UnsupportedVersion { found: 2, .. })
        ));
        assert!(corrupt_detail(base, &[VERSION]).contains("target length"));
        let overlong = [&[VERSION][..], &[0xff; 10], &[0x01]].concat();
        assert!(corrupt_detail(base, &overlong).contains("overflows"));
        assert!(corrupt_detail(base, &delta(3, &[&[0, 0]], b"")).contains("zero-length"));
        assert!(corrupt_detail(base, &delta(3, &[&[3 << 1, 8]], b"")).contains("outside"));
        assert!(corrupt_detail(base, &delta(3, &[&[3 << 1, u64::MAX]], b"")).contains("outside"));
        assert!(corrupt_detail(base, &delta(2, &[&[3 << 1, 0]], b"")).contains("overruns"));
        assert!(corrupt_detail(base, &delta(3, &[&[(3 << 1) | 1]], b"ab")).contains("truncated"));
        assert!(corrupt_detail(base, &delta(3, &[&[2 << 1, 0]], b"")).contains("short"));
        // Bytes after the last op overrun the (already complete) target.
        assert!(
            corrupt_detail(base, &delta(2, &[&[2 << 1, 0], &[1 << 1, 0]], b""))
                .contains("overruns")
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        #[test]
        fn random_deltas_never_panic(
            base in prop::collection::vec(any::<u8>(), 0..64),
            mut d in prop::collection::vec(any::<u8>(), 0..64),
            valid_version in any::<bool>(),
        ) {
            if valid_version && !d.is_empty() {
                d[0] = VERSION;
            }
            if let Ok(out) = decode(&base, &d) {
                // A delta that decodes is well formed: its declared length holds.
                let mut r = Reader { buf: &d, pos: 1 };
                prop_assert_eq!(Some(out.len() as u64), r.varint("").ok());
            }
        }
    }
}
