//! Batched offers, answers and ends (wire version 2): several dispatches of one pool in one
//! NATS message. Every body opens with a 4-byte tag, three letters and the version byte, so a
//! body of another kind or version is refused by name rather than misread.
//!
//! ```text
//! offers  "SYO" 2 | u32 header length | header JSON (OfferHeader) | u16 count
//!         | count × (u64 forward | u64 timeout ms | u32 attempt offset | u32 input length | input)
//! answers "SYA" 2 | u16 taker node length | taker node | u16 count
//!         | count × (u64 forward | u8 kind: 0 busy, 1 taken, 2 ended
//!                    | for ended: u32 end length | end, see [`super::end`])
//! ends    "SYE" 2 | u16 count | count × (u32 end length | end body)
//! ```
//!
//! Integers are big-endian. A batch holds at most [`MAX_BATCH`] entries; a count above it, a
//! length past the end of the body, or bytes left over after the last entry are refused with a
//! [`WireError`], before anything is allocated for the entries. An answer that leaves out one
//! of the offered forwards did not take it (a taker answers each forward it started).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use super::end::{decode_end, end_len, put_end};
use super::{RemoteEnd, WireError};

/// The most entries one batch may carry, on the way out and on the way in.
pub(crate) const MAX_BATCH: usize = 256;

/// The most bytes of ends one answer or ends message carries (one larger end still goes,
/// alone): well under NATS's default `max_payload` of 1 MiB.
pub(crate) const ENDS_BYTES: usize = 256 * 1024;

/// The batched wire format's version, the fourth byte of every tag. Version 1 carried each
/// end as JSON metadata; version 2 as a binary head ([`super::end`]). A node reads only its
/// own version: a body with another version's tag is refused by name.
pub(crate) const BATCH_VERSION: u8 = 2;

const OFFERS_TAG: [u8; 4] = [b'S', b'Y', b'O', BATCH_VERSION];
const ANSWERS_TAG: [u8; 4] = [b'S', b'Y', b'A', BATCH_VERSION];
const ENDS_TAG: [u8; 4] = [b'S', b'Y', b'E', BATCH_VERSION];

/// What every dispatch of an offer batch shares: its origin and its pool's address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct OfferHeader {
    pub(crate) origin: String,
    pub(crate) namespace: String,
    pub(crate) task_queue: String,
    pub(crate) activity_type: String,
    pub(crate) node: Option<String>,
}

/// One dispatch of an offer batch; the rest of its request is the batch's [`OfferHeader`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OfferEntry {
    pub(crate) forward: u64,
    pub(crate) timeout_ms: u64,
    pub(crate) attempt_offset: u32,
    pub(crate) input: Bytes,
}

/// A taker's answer for one forward of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EntryAnswer {
    /// Not taken (no free slot here any more, or cancelled first).
    Busy,
    /// Taken; its end follows on the origin's outcome subject.
    Taken,
    /// Taken and already ended: its one end rides in the answer.
    Ended(RemoteEnd),
}

/// A taker's answer to a batch: who answered, and one answer per forward it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchAnswer {
    pub(crate) taker: String,
    pub(crate) entries: Vec<(u64, EntryAnswer)>,
}

const BUSY: u8 = 0;
const TAKEN: u8 = 1;
const ENDED: u8 = 2;

/// Encodes an offer batch. At most [`MAX_BATCH`] entries are written (the caller never
/// gathers more).
pub(crate) fn encode_offers(header: &OfferHeader, entries: &[OfferEntry]) -> Bytes {
    let json = serde_json::to_vec(header).unwrap_or_default();
    let entries = &entries[..entries.len().min(MAX_BATCH)];
    let size = entries.iter().map(|e| 24 + e.input.len()).sum::<usize>();
    let mut body = BytesMut::with_capacity(4 + 4 + json.len() + 2 + size);
    body.put_slice(&OFFERS_TAG);
    body.put_u32(len_u32(json.len()));
    body.put_slice(&json);
    body.put_u16(count_u16(entries.len()));
    for entry in entries {
        body.put_u64(entry.forward);
        body.put_u64(entry.timeout_ms);
        body.put_u32(entry.attempt_offset);
        body.put_u32(len_u32(entry.input.len()));
        body.put_slice(&entry.input);
    }
    body.freeze()
}

/// Reads an offer batch; the entries' inputs share `body`'s buffer.
pub(crate) fn decode_offers(body: &Bytes) -> Result<(OfferHeader, Vec<OfferEntry>), WireError> {
    let mut reader = Reader::open(body, OFFERS_TAG)?;
    let json = reader.bytes_u32()?;
    let header: OfferHeader =
        serde_json::from_slice(&json).map_err(|e| WireError::Metadata(e.to_string()))?;
    let count = reader.count()?;
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        entries.push(OfferEntry {
            forward: reader.u64()?,
            timeout_ms: reader.u64()?,
            attempt_offset: reader.u32()?,
            input: reader.bytes_u32()?,
        });
    }
    reader.finish()?;
    Ok((header, entries))
}

/// Encodes a taker's answer to a batch.
pub(crate) fn encode_answers(answer: &BatchAnswer) -> Bytes {
    let entries = &answer.entries[..answer.entries.len().min(MAX_BATCH)];
    let ends: usize = entries
        .iter()
        .map(|(_, entry)| match entry {
            EntryAnswer::Ended(end) => 4 + end_len(end),
            _ => 0,
        })
        .sum();
    let mut body = BytesMut::with_capacity(8 + answer.taker.len() + 9 * entries.len() + ends);
    body.put_slice(&ANSWERS_TAG);
    let taker = &answer.taker.as_bytes()[..answer.taker.len().min(usize::from(u16::MAX))];
    body.put_u16(count_u16(taker.len()));
    body.put_slice(taker);
    body.put_u16(count_u16(entries.len()));
    for (forward, entry) in entries {
        body.put_u64(*forward);
        match entry {
            EntryAnswer::Busy => body.put_u8(BUSY),
            EntryAnswer::Taken => body.put_u8(TAKEN),
            EntryAnswer::Ended(end) => {
                body.put_u8(ENDED);
                body.put_u32(len_u32(end_len(end)));
                put_end(&mut body, *forward, end);
            }
        }
    }
    body.freeze()
}

/// Encodes a taker's answer within [`ENDS_BYTES`] of ends: an end that would carry the
/// answer past it is answered "taken" instead and returned, to go on the outcome subject.
pub(crate) fn encode_answers_bounded(mut answer: BatchAnswer) -> (Bytes, Vec<(u64, RemoteEnd)>) {
    let mut bytes = 0usize;
    let mut late = Vec::new();
    for (forward, entry) in &mut answer.entries {
        if let EntryAnswer::Ended(end) = entry {
            let size = end_size(end);
            if bytes > 0 && bytes.saturating_add(size) > ENDS_BYTES {
                if let EntryAnswer::Ended(end) = std::mem::replace(entry, EntryAnswer::Taken) {
                    late.push((*forward, end));
                }
            } else {
                bytes = bytes.saturating_add(size);
            }
        }
    }
    (encode_answers(&answer), late)
}

/// Encodes ends as few messages as [`MAX_BATCH`] and [`ENDS_BYTES`] allow (a larger end goes
/// alone), in order.
pub(crate) fn encode_ends_bounded(ends: &[(u64, RemoteEnd)]) -> Vec<Bytes> {
    let mut bodies = Vec::new();
    let mut start = 0;
    while start < ends.len() {
        let mut bytes = 0usize;
        let mut end = start;
        while end < ends.len() && end - start < MAX_BATCH {
            let size = ends.get(end).map_or(0, |(_, e)| end_size(e));
            if end > start && bytes.saturating_add(size) > ENDS_BYTES {
                break;
            }
            bytes = bytes.saturating_add(size);
            end += 1;
        }
        if let Some(chunk) = ends.get(start..end) {
            bodies.push(encode_ends(chunk));
        }
        start = end;
    }
    bodies
}

/// How many bytes an end takes on the wire, with its length prefix.
fn end_size(end: &RemoteEnd) -> usize {
    end_len(end).saturating_add(4)
}

/// Reads a taker's answer to a batch.
pub(crate) fn decode_answers(body: &Bytes) -> Result<BatchAnswer, WireError> {
    let mut reader = Reader::open(body, ANSWERS_TAG)?;
    let taker_len = usize::from(reader.u16()?);
    let taker = String::from_utf8_lossy(&reader.take(taker_len)?).into_owned();
    let count = reader.count()?;
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let forward = reader.u64()?;
        let entry = match reader.u8()? {
            BUSY => EntryAnswer::Busy,
            TAKEN => EntryAnswer::Taken,
            ENDED => {
                let (ended, end) = decode_end(&reader.bytes_u32()?)?;
                if ended != forward {
                    return Err(WireError::Metadata(format!(
                        "end of forward {ended} under forward {forward}"
                    )));
                }
                EntryAnswer::Ended(end)
            }
            kind => return Err(WireError::Metadata(format!("unknown answer kind {kind}"))),
        };
        entries.push((forward, entry));
    }
    reader.finish()?;
    Ok(BatchAnswer { taker, entries })
}

/// Encodes the ends of several forwards for one origin.
pub(crate) fn encode_ends(ends: &[(u64, RemoteEnd)]) -> Bytes {
    let ends = &ends[..ends.len().min(MAX_BATCH)];
    let size = ends.iter().map(|(_, end)| 4 + end_len(end)).sum::<usize>();
    let mut body = BytesMut::with_capacity(6 + size);
    body.put_slice(&ENDS_TAG);
    body.put_u16(count_u16(ends.len()));
    for (forward, end) in ends {
        body.put_u32(len_u32(end_len(end)));
        put_end(&mut body, *forward, end);
    }
    body.freeze()
}

/// Reads the ends of several forwards.
pub(crate) fn decode_ends(body: &Bytes) -> Result<Vec<(u64, RemoteEnd)>, WireError> {
    let mut reader = Reader::open(body, ENDS_TAG)?;
    let count = reader.count()?;
    let mut ends = Vec::with_capacity(count);
    for _ in 0..count {
        ends.push(decode_end(&reader.bytes_u32()?)?);
    }
    reader.finish()?;
    Ok(ends)
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn count_u16(count: usize) -> u16 {
    u16::try_from(count).unwrap_or(u16::MAX)
}

/// A bounds-checked cursor over a body: every read past the end is [`WireError::Truncated`].
struct Reader {
    body: Bytes,
}

impl Reader {
    fn open(body: &Bytes, tag: [u8; 4]) -> Result<Self, WireError> {
        let mut body = body.clone();
        let found = body.get(..4).ok_or(WireError::Truncated)?;
        if found != tag {
            return Err(WireError::Tag {
                expected: tag_name(tag),
                found: tag_name([found[0], found[1], found[2], found[3]]),
            });
        }
        body.advance(4);
        Ok(Self { body })
    }

    fn take(&mut self, len: usize) -> Result<Bytes, WireError> {
        if self.body.len() < len {
            return Err(WireError::Truncated);
        }
        Ok(self.body.split_to(len))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let bytes = self.take(N)?;
        <[u8; N]>::try_from(&bytes[..]).map_err(|_| WireError::Truncated)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A u32 length, then that many bytes.
    fn bytes_u32(&mut self) -> Result<Bytes, WireError> {
        let len = usize::try_from(self.u32()?).map_err(|_| WireError::Truncated)?;
        self.take(len)
    }

    /// An entry count, checked against [`MAX_BATCH`].
    fn count(&mut self) -> Result<usize, WireError> {
        let count = usize::from(self.u16()?);
        if count > MAX_BATCH {
            return Err(WireError::TooManyEntries { count });
        }
        Ok(count)
    }

    fn finish(self) -> Result<(), WireError> {
        match self.body.len() {
            0 => Ok(()),
            extra => Err(WireError::TrailingBytes { extra }),
        }
    }
}

/// A tag as text for an error: printable bytes as they are, others in hex.
fn tag_name(tag: [u8; 4]) -> String {
    tag.iter()
        .map(|b| {
            if b.is_ascii_graphic() {
                char::from(*b).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use switchyard_core::ActivityOutcome;

    use super::*;

    fn header() -> OfferHeader {
        OfferHeader {
            origin: "a".to_owned(),
            namespace: "ns".to_owned(),
            task_queue: "q".to_owned(),
            activity_type: "act".to_owned(),
            node: Some("gpu".to_owned()),
        }
    }

    /// A small deterministic generator (xorshift), for round trips over many shapes.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn bytes(&mut self, max: u64) -> Bytes {
            let len = self.below(max + 1);
            (0..len)
                .map(|_| self.next() as u8)
                .collect::<Vec<u8>>()
                .into()
        }
    }

    fn entries(generator: &mut Gen, count: usize) -> Vec<OfferEntry> {
        (0..count)
            .map(|_| OfferEntry {
                forward: generator.next(),
                timeout_ms: generator.next(),
                attempt_offset: generator.next() as u32,
                input: generator.bytes(40),
            })
            .collect()
    }

    fn end(generator: &mut Gen) -> RemoteEnd {
        match generator.below(3) {
            0 => RemoteEnd::Lost,
            1 => RemoteEnd::Outcome(ActivityOutcome::Completed(generator.bytes(30))),
            _ => RemoteEnd::Outcome(ActivityOutcome::Failed {
                message: "no\nway".to_owned(),
                retryable: generator.below(2) == 1,
            }),
        }
    }

    #[test]
    fn offer_batches_of_every_size_round_trip() {
        let mut generator = Gen(0x5eed);
        for count in [0, 1, 2, 17, MAX_BATCH] {
            let sent = entries(&mut generator, count);
            let body = encode_offers(&header(), &sent);
            assert_eq!(decode_offers(&body), Ok((header(), sent)));
        }
    }

    #[test]
    fn answers_and_ends_round_trip() {
        let mut generator = Gen(0xfeed);
        for count in [0, 1, 5, MAX_BATCH] {
            let entries: Vec<(u64, EntryAnswer)> = (0..count)
                .map(|_| {
                    let forward = generator.next();
                    let entry = match generator.below(3) {
                        0 => EntryAnswer::Busy,
                        1 => EntryAnswer::Taken,
                        _ => EntryAnswer::Ended(end(&mut generator)),
                    };
                    (forward, entry)
                })
                .collect();
            let answer = BatchAnswer {
                taker: "n2".to_owned(),
                entries,
            };
            assert_eq!(decode_answers(&encode_answers(&answer)), Ok(answer));
            let ends: Vec<(u64, RemoteEnd)> = (0..count)
                .map(|_| (generator.next(), end(&mut generator)))
                .collect();
            assert_eq!(decode_ends(&encode_ends(&ends)), Ok(ends));
        }
    }

    #[test]
    fn every_cut_or_corrupted_batch_is_a_typed_error_not_a_panic() {
        let mut generator = Gen(42);
        let offers = encode_offers(&header(), &entries(&mut generator, 3));
        let answers = encode_answers(&BatchAnswer {
            taker: "n3".to_owned(),
            entries: vec![
                (1, EntryAnswer::Busy),
                (2, EntryAnswer::Ended(end(&mut generator))),
                (3, EntryAnswer::Taken),
            ],
        });
        let ends = encode_ends(&[(4, RemoteEnd::Lost), (5, end(&mut generator))]);
        for body in [&offers, &answers, &ends] {
            // Every proper prefix is refused ...
            for cut in 0..body.len() {
                let short = body.slice(..cut);
                assert!(decode_offers(&short).is_err(), "offers cut at {cut}");
                assert!(decode_answers(&short).is_err(), "answers cut at {cut}");
                assert!(decode_ends(&short).is_err(), "ends cut at {cut}");
            }
            // ... and so is every single flipped byte that the decoders can notice; none
            // panics (the flips that still decode are payload bytes).
            for at in 0..body.len() {
                let mut flipped = body.to_vec();
                flipped[at] ^= 0xa5;
                let flipped = Bytes::from(flipped);
                let _ = decode_offers(&flipped);
                let _ = decode_answers(&flipped);
                let _ = decode_ends(&flipped);
            }
        }
        // Control: the intact bodies read, each only as its own kind.
        assert!(decode_offers(&offers).is_ok());
        assert!(decode_answers(&answers).is_ok());
        assert!(decode_ends(&ends).is_ok());
        assert!(matches!(
            decode_answers(&offers),
            Err(WireError::Tag { .. })
        ));
        // Trailing bytes are refused.
        let mut long = ends.to_vec();
        long.push(0);
        assert_eq!(
            decode_ends(&Bytes::from(long)),
            Err(WireError::TrailingBytes { extra: 1 })
        );
    }

    #[test]
    fn a_count_over_the_limit_is_refused_before_anything_is_read() {
        let mut body = BytesMut::new();
        body.put_slice(&ENDS_TAG);
        body.put_u16(u16::try_from(MAX_BATCH + 1).expect("small"));
        assert_eq!(
            decode_ends(&body.freeze()),
            Err(WireError::TooManyEntries {
                count: MAX_BATCH + 1
            })
        );
        // Control: at the limit the count is read, and the missing entries are the error.
        let mut body = BytesMut::new();
        body.put_slice(&ENDS_TAG);
        body.put_u16(u16::try_from(MAX_BATCH).expect("small"));
        assert_eq!(decode_ends(&body.freeze()), Err(WireError::Truncated));
    }

    #[test]
    fn another_version_is_refused_naming_both_tags() {
        let mut body = encode_ends(&[(1, RemoteEnd::Lost)]).to_vec();
        body[3] = BATCH_VERSION + 1;
        let error = decode_ends(&Bytes::from(body)).expect_err("version 3");
        assert_eq!(
            error.to_string(),
            "message tag SYE\\x03, expected SYE\\x02 (another wire version?)"
        );
    }

    /// The bodies a version-1 node sent, byte for byte (its ends carried JSON metadata).
    fn version_1_bodies() -> [Bytes; 3] {
        let json = br#"{"forward":5,"end":"completed","retryable":false,"reason":null,"transport":null,"attempts":0}"#;
        let mut end = BytesMut::new();
        end.put_u32(len_u32(json.len()));
        end.put_slice(json);
        end.put_slice(b"out");
        let mut ends = BytesMut::new();
        ends.put_slice(b"SYE\x01");
        ends.put_u16(1);
        ends.put_u32(len_u32(end.len()));
        ends.put_slice(&end);
        let mut answers = BytesMut::new();
        answers.put_slice(b"SYA\x01");
        answers.put_u16(2);
        answers.put_slice(b"n2");
        answers.put_u16(1);
        answers.put_u64(5);
        answers.put_u8(ENDED);
        answers.put_u32(len_u32(end.len()));
        answers.put_slice(&end);
        let mut offers = BytesMut::new();
        offers.put_slice(b"SYO\x01");
        let header = br#"{"origin":"a","namespace":"ns","task_queue":"q","activity_type":"act","node":null}"#;
        offers.put_u32(len_u32(header.len()));
        offers.put_slice(header);
        offers.put_u16(0);
        [offers.freeze(), answers.freeze(), ends.freeze()]
    }

    #[test]
    fn a_version_1_node_is_refused_by_name_not_misread() {
        let [offers, answers, ends] = version_1_bodies();
        for (error, kind) in [
            (decode_offers(&offers).map(|_| ()), "SYO"),
            (decode_answers(&answers).map(|_| ()), "SYA"),
            (decode_ends(&ends).map(|_| ()), "SYE"),
        ] {
            assert_eq!(
                error.map_err(|e| e.to_string()),
                Err(format!(
                    "message tag {kind}\\x01, expected {kind}\\x02 (another wire version?)"
                ))
            );
        }
        // Control: the same bodies under this version's tags are read (the offers, whose
        // layout did not change) or refused for their JSON ends (the answers and ends): the tag
        // is what stops a version-1 body, before any end is misread.
        let retag = |body: &Bytes| {
            let mut body = body.to_vec();
            body[3] = BATCH_VERSION;
            Bytes::from(body)
        };
        assert!(decode_offers(&retag(&offers)).is_ok());
        assert!(decode_answers(&retag(&answers)).is_err());
        assert!(decode_ends(&retag(&ends)).is_err());
    }

    fn big_end(size: usize) -> RemoteEnd {
        RemoteEnd::Outcome(ActivityOutcome::Completed(Bytes::from(vec![7; size])))
    }

    #[test]
    fn ends_past_the_byte_budget_leave_the_answer_and_go_on_their_own() {
        let answer = BatchAnswer {
            taker: "n2".to_owned(),
            entries: vec![
                (1, EntryAnswer::Ended(big_end(ENDS_BYTES / 2))),
                (2, EntryAnswer::Busy),
                (3, EntryAnswer::Ended(big_end(ENDS_BYTES / 2))),
                (4, EntryAnswer::Ended(big_end(10))),
            ],
        };
        let (body, late) = encode_answers_bounded(answer);
        let read = decode_answers(&body).expect("reads");
        assert_eq!(
            read.entries[0],
            (1, EntryAnswer::Ended(big_end(ENDS_BYTES / 2)))
        );
        assert_eq!(read.entries[1], (2, EntryAnswer::Busy));
        assert_eq!(read.entries[2], (3, EntryAnswer::Taken), "past the budget");
        assert_eq!(
            read.entries[3],
            (4, EntryAnswer::Ended(big_end(10))),
            "fits"
        );
        assert_eq!(late, vec![(3, big_end(ENDS_BYTES / 2))]);
        // Every end is in exactly one place: the late one is sent, alone past the budget.
        let bodies =
            encode_ends_bounded(&[(3, big_end(ENDS_BYTES)), (5, big_end(1)), (6, big_end(1))]);
        let read: Vec<Vec<u64>> = bodies
            .iter()
            .map(|b| {
                decode_ends(b)
                    .expect("reads")
                    .into_iter()
                    .map(|(f, _)| f)
                    .collect()
            })
            .collect();
        assert_eq!(read, vec![vec![3], vec![5, 6]]);
        // Control: small ends all fit in one answer and one message.
        let (_, late) = encode_answers_bounded(BatchAnswer {
            taker: "n2".to_owned(),
            entries: vec![(1, EntryAnswer::Ended(big_end(1)))],
        });
        assert!(late.is_empty());
        let many: Vec<(u64, RemoteEnd)> = (0..MAX_BATCH as u64 + 1)
            .map(|f| (f, RemoteEnd::Lost))
            .collect();
        assert_eq!(encode_ends_bounded(&many).len(), 2, "MAX_BATCH per message");
    }

    #[test]
    fn an_end_filed_under_another_forward_is_refused() {
        let mut body = BytesMut::new();
        body.put_slice(&ANSWERS_TAG);
        body.put_u16(0);
        body.put_u16(1);
        body.put_u64(7);
        body.put_u8(ENDED);
        let end = super::super::end::encode_end(8, &RemoteEnd::Lost);
        body.put_u32(len_u32(end.len()));
        body.put_slice(&end);
        assert!(matches!(
            decode_answers(&body.freeze()),
            Err(WireError::Metadata(_))
        ));
    }

    /// `docs/cluster.md`, "Batched offers": a batch of more than 256 entries is refused, and an
    /// answer carries at most 256 KiB of ends.
    #[test]
    fn the_wire_bounds_are_the_documented_ones() {
        assert_eq!(MAX_BATCH, 256);
        assert_eq!(ENDS_BYTES, 256 * 1024);
    }

    /// `docs/cluster.md`, "Batched offers", byte for byte: an answer's tag, taker and count,
    /// then per forward its number and 0 busy, 1 taken, 2 ended (with the end's length and the
    /// end); an offer entry's forward, timeout, attempt offset, input length and input.
    #[test]
    fn answers_and_offer_entries_have_the_documented_layout() {
        let answer = encode_answers(&BatchAnswer {
            taker: "c".to_owned(),
            entries: vec![
                (1, EntryAnswer::Busy),
                (2, EntryAnswer::Taken),
                (3, EntryAnswer::Ended(RemoteEnd::Lost)),
            ],
        });
        let mut expected = b"SYA\x02".to_vec();
        expected.extend_from_slice(&[0, 1, b'c', 0, 3]);
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 0]);
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 2, 1]);
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 3, 2, 0, 0, 0, 16]);
        // The end: forward 3, kind 0 (lost), not retryable, no attempts, no label.
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&answer[..], &expected[..]);

        let header = OfferHeader {
            origin: "a".to_owned(),
            namespace: "ns".to_owned(),
            task_queue: "default".to_owned(),
            activity_type: "work".to_owned(),
            node: None,
        };
        let offers = encode_offers(
            &header,
            &[OfferEntry {
                forward: 5,
                timeout_ms: 2_000,
                attempt_offset: 1,
                input: Bytes::from_static(b"in"),
            }],
        );
        assert_eq!(&offers[..4], b"SYO\x02");
        let json_len = u32::from_be_bytes([offers[4], offers[5], offers[6], offers[7]]) as usize;
        let entry = &offers[8 + json_len..];
        let mut expected = vec![0, 1];
        expected.extend_from_slice(&5u64.to_be_bytes());
        expected.extend_from_slice(&2_000u64.to_be_bytes());
        expected.extend_from_slice(&1u32.to_be_bytes());
        expected.extend_from_slice(&2u32.to_be_bytes());
        expected.extend_from_slice(b"in");
        assert_eq!(entry, &expected[..]);
    }
}
