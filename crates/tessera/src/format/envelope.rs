//! The envelope every repository object except containers is wrapped in:
//! a magic number, the object kind, its format version, the payload length,
//! the payload and a CRC-32C over all of it (docs/FORMAT.md, "Envelope").

use crate::error::{Error, Result};
use std::io::Write;

/// Magic bytes at the start of every enveloped object.
pub const MAGIC: &[u8; 4] = b"TSRA";
/// Bytes of the envelope header (magic, kind, version, payload length).
pub const HEADER_LEN: usize = 4 + 4 + 4 + 8;
/// Bytes of the envelope trailer (the CRC-32C, little-endian).
pub const TRAILER_LEN: usize = 4;

/// Wraps `payload` as an object of `kind` at format `version`.
pub fn seal(kind: &[u8; 4], version: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + TRAILER_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(kind);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Writes an object of `kind` at format `version` to `out` without holding
/// it in memory: the same bytes as [`seal`] of the `payload_len` bytes that
/// `payload` writes (an error if it writes another number).
pub fn seal_streamed(
    kind: &[u8; 4],
    version: u32,
    payload_len: u64,
    out: &mut dyn Write,
    payload: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    let io_err = |e| Error::io("writing an object", e);
    let mut w = CrcWriter {
        out,
        crc: 0,
        len: 0,
    };
    let mut header = Vec::with_capacity(HEADER_LEN);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(kind);
    header.extend_from_slice(&version.to_le_bytes());
    header.extend_from_slice(&payload_len.to_le_bytes());
    w.write_all(&header).map_err(io_err)?;
    payload(&mut w)?;
    if w.len != HEADER_LEN as u64 + payload_len {
        return Err(Error::Pipeline(format!(
            "object payload of {} bytes announced as {payload_len}",
            w.len - HEADER_LEN as u64
        )));
    }
    let crc = w.crc;
    w.out.write_all(&crc.to_le_bytes()).map_err(io_err)
}

/// Passes bytes on, counting them and computing their CRC-32C.
struct CrcWriter<'a> {
    out: &'a mut dyn Write,
    crc: u32,
    len: u64,
}

impl Write for CrcWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Checks the envelope of `object` (named `name` in errors) and returns its payload.
///
/// Fails if the magic, kind, length or checksum do not hold, or if the
/// version differs from `version`.
pub fn open<'a>(name: &str, kind: &[u8; 4], version: u32, object: &'a [u8]) -> Result<&'a [u8]> {
    open_versions(name, kind, &[version], object).map(|(_, payload)| payload)
}

/// Like [`open`], for an object that may be at any of the `versions`
/// (an unknown version is reported against the highest of them); returns the version found
/// and the payload.
pub fn open_versions<'a>(
    name: &str,
    kind: &[u8; 4],
    versions: &[u32],
    object: &'a [u8],
) -> Result<(u32, &'a [u8])> {
    check_header(
        name,
        kind,
        &object[..object.len().min(HEADER_LEN)],
        object.len() as u64,
    )?;
    let body_end = object.len() - TRAILER_LEN;
    let stored_crc = u32::from_le_bytes(le4(&object[body_end..]));
    if crc32c::crc32c(&object[..body_end]) != stored_crc {
        return Err(Error::corrupt(name, "checksum mismatch"));
    }
    let found = check_version(name, versions, &object[..HEADER_LEN])?;
    Ok((found, &object[HEADER_LEN..body_end]))
}

/// Checks the header of an object of `kind` (its first bytes, `header`,
/// [`HEADER_LEN`] of them unless the object is shorter) stored in
/// `object_len` bytes: magic, kind and length. Returns the payload length.
/// The checksum and the version ([`check_version`]) are checked by the
/// reader, after the payload: [`open_versions`] and streamed readers alike.
pub fn check_header(name: &str, kind: &[u8; 4], header: &[u8], object_len: u64) -> Result<u64> {
    if object_len < (HEADER_LEN + TRAILER_LEN) as u64 || header.len() < HEADER_LEN {
        return Err(Error::corrupt(
            name,
            format!("truncated: {object_len} bytes is shorter than an envelope"),
        ));
    }
    if &header[0..4] != MAGIC {
        return Err(Error::corrupt(name, "bad magic (not a Tessera object)"));
    }
    if &header[4..8] != kind {
        return Err(Error::corrupt(
            name,
            format!(
                "object kind {:?}, expected {:?}",
                String::from_utf8_lossy(&header[4..8]),
                String::from_utf8_lossy(kind)
            ),
        ));
    }
    let payload_len = u64::from_le_bytes(le8(&header[12..20]));
    // Saturating: a damaged length field must not overflow.
    let expected_len = payload_len.saturating_add((HEADER_LEN + TRAILER_LEN) as u64);
    if object_len != expected_len {
        return Err(Error::corrupt(
            name,
            format!(
                "length {object_len} does not match the {expected_len} bytes its header announces (truncated?)"
            ),
        ));
    }
    Ok(payload_len)
}

/// The format version in `header` (checked by [`check_header`]) if it is
/// one of `versions`.
pub fn check_version(name: &str, versions: &[u32], header: &[u8]) -> Result<u32> {
    let found = u32::from_le_bytes(le4(&header[8..12]));
    if !versions.contains(&found) {
        return Err(Error::UnsupportedVersion {
            object: name.to_string(),
            found,
            supported: versions.iter().copied().max().unwrap_or_default(),
        });
    }
    Ok(found)
}

/// Copies 4 bytes of a slice known to be 4 bytes long.
pub(crate) fn le4(b: &[u8]) -> [u8; 4] {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    a
}

/// Copies 8 bytes of a slice known to be 8 bytes long.
pub(crate) fn le8(b: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let sealed = seal(b"TEST", 3, b"hello");
        assert_eq!(open("t", b"TEST", 3, &sealed).unwrap(), b"hello");
    }

    #[test]
    fn detects_every_single_byte_flip() {
        let sealed = seal(b"TEST", 1, b"some payload bytes");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            assert!(
                open("t", b"TEST", 1, &bad).is_err(),
                "flip at {i} undetected"
            );
        }
    }

    #[test]
    fn a_huge_length_field_is_an_error() {
        let mut sealed = seal(b"TEST", 1, b"payload");
        sealed[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            open("t", b"TEST", 1, &sealed),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn detects_truncation_and_wrong_kind_and_version() {
        let sealed = seal(b"TEST", 1, b"payload");
        for n in 0..sealed.len() {
            assert!(open("t", b"TEST", 1, &sealed[..n]).is_err());
        }
        assert!(matches!(
            open("t", b"OTHR", 1, &sealed),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            open("t", b"TEST", 2, &sealed),
            Err(Error::UnsupportedVersion {
                found: 1,
                supported: 2,
                ..
            })
        ));
    }
}
