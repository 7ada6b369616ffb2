//! The built-in corpus: simple English generated from a small grammar with a
//! fixed seed, for runs given no data.

use super::rng::SplitMix64;

/// Seed of the built-in corpus. Changing it (or the word lists below) changes
/// the corpus, which the golden-hash test is there to catch.
const DEFAULT_CORPUS_SEED: u64 = 0x5EED_C0A9_0B05_2024;

/// Size the built-in corpus grows to before stopping at a paragraph boundary.
const DEFAULT_CORPUS_TARGET_BYTES: usize = 400_000;

const NAMES: &[&str] = &[
    "Anna", "Ben", "Clara", "David", "Ella", "Finn", "Grace", "Hugo", "Ivy", "Jonas",
];

const PEOPLE: &[&str] = &[
    "the old fisherman",
    "the baker",
    "a young girl",
    "the farmer",
    "my brother",
    "the teacher",
    "a tired soldier",
    "the little boy",
    "the queen",
    "a quiet woman",
    "her mother",
    "the sailor",
];

const ANIMALS: &[&str] = &[
    "the cat",
    "a brown dog",
    "the grey horse",
    "a small fox",
    "the white goose",
    "an old owl",
    "the black bird",
    "a lazy pig",
];

const TRANSITIVE: &[&str] = &[
    "found",
    "carried",
    "painted",
    "watched",
    "lost",
    "opened",
    "cleaned",
    "sold",
    "bought",
    "mended",
    "hid",
    "counted",
    "dropped",
    "kept",
    "wanted",
    "gave away",
];

const INTRANSITIVE: &[&str] = &[
    "slept",
    "sang",
    "waited",
    "laughed",
    "walked home",
    "sat down",
    "ran",
    "danced",
    "worked",
    "rested",
    "cried",
    "looked around",
];

const ADJECTIVES: &[&str] = &[
    "red", "small", "old", "heavy", "wooden", "bright", "broken", "warm", "green", "quiet",
    "little", "shiny", "empty", "blue",
];

const NOUNS: &[&str] = &[
    "box",
    "boat",
    "lamp",
    "basket",
    "letter",
    "coat",
    "key",
    "cup",
    "book",
    "rope",
    "bell",
    "loaf of bread",
    "bag of apples",
    "hat",
    "map",
    "chair",
];

const PLACES: &[&str] = &[
    "near the river",
    "in the garden",
    "at the market",
    "under the old bridge",
    "on the hill",
    "by the sea",
    "in the kitchen",
    "behind the barn",
    "in the forest",
    "at the station",
    "on the road",
    "in the village",
];

const TIMES: &[&str] = &[
    "in the morning",
    "at night",
    "before dinner",
    "after the rain",
    "on Sunday",
    "in the winter",
    "at noon",
    "every evening",
    "the next day",
    "long ago",
];

const FEELINGS: &[&str] = &[
    "happy", "sad", "tired", "angry", "glad", "cold", "hungry", "afraid", "proud", "calm",
];

const QUOTES: &[&str] = &[
    "It is time to go home.",
    "I have never seen such a thing.",
    "The sea is calm today.",
    "We must help them.",
    "Look at the sky!",
    "Where did you put it?",
    "Thank you, my friend.",
    "The bread is still warm.",
    "Do not be afraid.",
    "Tomorrow will be a better day.",
];

/// Fixed lines that recur verbatim, giving the model long exact strings to
/// memorise (a visible sign of learning when sampling).
const REFRAINS: &[&str] = &[
    "And so the days went by, one after another, and the river ran on to the sea.",
    "The wind was soft, the fields were green, and all was well in the village.",
    "That night the stars came out, and everyone slept in peace.",
];

/// Returns a built-in corpus of simple English (about 400 KB, pure ASCII).
///
/// It is generated from a small grammar with a fixed seed, so it is identical
/// on every call and platform, needs no files, and is regular enough that a
/// tiny character-level model visibly learns it within minutes.
pub fn default_corpus() -> String {
    let mut rng = SplitMix64::new(DEFAULT_CORPUS_SEED);
    let mut out = String::with_capacity(DEFAULT_CORPUS_TARGET_BYTES + 4096);
    let mut paragraph = 0usize;
    let mut chapter = 0usize;
    while out.len() < DEFAULT_CORPUS_TARGET_BYTES {
        if paragraph.is_multiple_of(24) {
            chapter += 1;
            out.push_str(&format!("Chapter {chapter}\n\n"));
        }
        let sentences = 3 + rng.below(4);
        for i in 0..sentences {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&sentence(&mut rng));
        }
        out.push_str("\n\n");
        paragraph += 1;
        if paragraph.is_multiple_of(7) {
            out.push_str(rng.pick(REFRAINS));
            out.push_str("\n\n");
        }
    }
    // No trailing blank line: the corpus ends on text.
    out.truncate(out.trim_end().len());
    out
}

fn subject(rng: &mut SplitMix64) -> String {
    match rng.below(3) {
        0 => rng.pick(NAMES).to_owned(),
        1 => rng.pick(PEOPLE).to_owned(),
        _ => rng.pick(ANIMALS).to_owned(),
    }
}

/// A noun phrase with a correct article, e.g. "an old box" or "the red boat".
fn object(rng: &mut SplitMix64) -> String {
    let adjective = rng.pick(ADJECTIVES);
    let noun = rng.pick(NOUNS);
    let article = match rng.below(3) {
        0 => "the",
        _ if adjective.starts_with(['a', 'e', 'i', 'o', 'u']) => "an",
        _ => "a",
    };
    format!("{article} {adjective} {noun}")
}

fn sentence(rng: &mut SplitMix64) -> String {
    let s = match rng.below(8) {
        0 => format!(
            "{} {} {} {}.",
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng),
            rng.pick(PLACES)
        ),
        1 => format!(
            "{}, {} {} {}.",
            rng.pick(TIMES),
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng)
        ),
        2 => format!(
            "{} {} {} {}.",
            subject(rng),
            rng.pick(INTRANSITIVE),
            rng.pick(PLACES),
            rng.pick(TIMES)
        ),
        3 => format!(
            "{} was {} because {} {} {}.",
            subject(rng),
            rng.pick(FEELINGS),
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng)
        ),
        4 => format!("{} said, \"{}\"", subject(rng), rng.pick(QUOTES)),
        5 => format!(
            "then {} {} {} and {}.",
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng),
            rng.pick(INTRANSITIVE)
        ),
        6 => format!(
            "{} {} {}, but {} {} {}.",
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng),
            subject(rng),
            rng.pick(INTRANSITIVE),
            rng.pick(PLACES)
        ),
        _ => format!(
            "when {} {}, {} {} {} {}.",
            subject(rng),
            rng.pick(INTRANSITIVE),
            subject(rng),
            rng.pick(TRANSITIVE),
            object(rng),
            rng.pick(PLACES)
        ),
    };
    capitalize_first(s)
}

fn capitalize_first(mut s: String) -> String {
    if let Some(first) = s.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a, used to pin the exact bytes of the built-in corpus.
    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    #[test]
    fn default_corpus_is_deterministic_ascii_and_sized() {
        let a = default_corpus();
        let b = default_corpus();
        assert_eq!(a, b);
        assert!(a.is_ascii());
        assert!(
            (300_000..=500_000).contains(&a.len()),
            "size {} out of range",
            a.len()
        );
        assert!(a.starts_with("Chapter 1\n\n"));
        assert!(!a.ends_with('\n'));
        // The corpus uses a small alphabet, so a byte model has little to learn
        // beyond the grammar.
        let distinct: std::collections::BTreeSet<u8> = a.bytes().collect();
        assert!(distinct.len() < 80, "{} distinct bytes", distinct.len());
        for refrain in REFRAINS {
            assert!(a.contains(refrain));
        }
    }

    #[test]
    fn default_corpus_golden() {
        // Pins the exact output: if this fails, the corpus changed, which
        // silently changes every training run that uses it.
        let corpus = default_corpus();
        assert_eq!(
            (corpus.len(), fnv1a(corpus.as_bytes())),
            (400_076, 0x77F0_28DD_9953_52F8)
        );
    }
}
