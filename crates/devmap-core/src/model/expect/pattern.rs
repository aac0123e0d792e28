//! The patterns of `_keys_to_ignore_on_load_*`: transformers' regular expressions, and
//! the table's globs they are written as, matched the way Python's `re.search` does.

/// Whether the regular expression `regex` matches somewhere in `name`, as `re.search`
/// does, for the expressions `_keys_to_ignore_on_load_*` use (`\.`, `\d+`, `.*`, `.`,
/// anchors, alternatives in one group); `None` for more of the syntax than that (the
/// caller then does not ignore the name).
pub fn regex_search(regex: &str, name: &str) -> Option<bool> {
    let alternatives = match (regex.find('('), regex.rfind(')')) {
        (Some(open), Some(close)) if open < close && !regex[open + 1..close].contains('(') => {
            let inner = regex[open + 1..close].trim_start_matches("?:");
            inner
                .split('|')
                .map(|alt| format!("{}{alt}{}", &regex[..open], &regex[close + 1..]))
                .collect()
        }
        (None, None) => vec![regex.to_owned()],
        _ => return None,
    };
    let mut found = false;
    for alt in alternatives {
        found |= glob_search(&glob_of(&alt)?, name);
    }
    Some(found)
}

/// A regular expression without groups as a [`glob_search`] pattern, as
/// `scripts/gen_expect_table.py` translates them; `None` for more of the syntax.
fn glob_of(regex: &str) -> Option<String> {
    let mut out = String::new();
    let bytes = regex.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &regex[i..];
        if rest.starts_with("\\.") {
            out.push('.');
            i += 2;
        } else if rest.starts_with("\\d+") {
            out.push('*');
            i += 3;
        } else if rest.starts_with(".*") {
            out.push('*');
            i += 2;
        } else if bytes[i] == b'.' {
            out.push('?');
            i += 1;
        } else if (bytes[i] == b'^' && i == 0)
            || (bytes[i] == b'$' && i == bytes.len() - 1)
            || bytes[i].is_ascii_alphanumeric()
            || b"_-/".contains(&bytes[i])
        {
            // Anchors at the ends, and characters that stand for themselves.
            out.push(bytes[i] as char);
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

/// Whether `pattern` matches somewhere in `name`, as `re.search` would match the
/// regular expression the generator translated it from: `^` and `$` anchor, `*` is any
/// run, `?` any one character, anything else itself.
pub(super) fn glob_search(pattern: &str, name: &str) -> bool {
    let (anchored, pattern) = match pattern.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    let (ends, pattern) = match pattern.strip_suffix('$') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    fn at(p: &[u8], t: &[u8], ends: bool) -> bool {
        match p.split_first() {
            None => !ends || t.is_empty(),
            Some((b'*', rest)) => (0..=t.len()).any(|skip| at(rest, &t[skip..], ends)),
            Some((&c, rest)) => t
                .split_first()
                .is_some_and(|(&x, tail)| (c == b'?' || c == x) && at(rest, tail, ends)),
        }
    }
    let (p, t) = (pattern.as_bytes(), name.as_bytes());
    if anchored {
        at(p, t, ends)
    } else {
        (0..=t.len()).any(|start| at(p, &t[start..], ends))
    }
}
