/*
 * grammar.h -- constrained decoding: a context-free grammar that the generated text must
 * follow (llama.cpp's --grammar / --json-schema, vLLM's guided decoding, OpenAI's
 * response_format). Untrusted input: tests/fuzz/fuzz_grammar.c, fuzz_grammar_schema.c.
 *
 * The grammar language: GBNF, as llama.cpp's grammars/README.md describes it
 *     # a comment runs to the end of its line
 *     root   ::= answer " " ("yes" | "no")    # rules: NAME ::= alternatives
 *     answer ::= [A-Z] [a-z]* | "ok"{1,3}
 *   - a rule name: letters, digits, '-' and '_'; a new rule starts where a name is followed by
 *     "::=" (so a rule may span lines); every name used must be defined; `root` (or the name
 *     given) is where a sentence starts;
 *   - terminals: "literal" (escapes \n \r \t \\ \" \' \[ \] \- \/ \xHH \uHHHH \UHHHHHHHH),
 *     [class] of characters and ranges, [^class] its complement, `.` any character: all of
 *     them over Unicode code points, written in UTF-8;
 *   - tokens (llama.cpp's too): <[id]> the token of that id, <text> the token whose vocabulary
 *     text is exactly <text> (brackets included: <|im_end|>, <think>), and !<[id]>, !<text> any
 *     one token but that one; they match whole tokens only, never bytes, so a special token
 *     that decodes to no text (a control token) can be asked for, and a grammar over text alone
 *     never matches one;
 *   - ( grouping ), and after an item: * (0 or more), + (1 or more), ? (0 or 1), {m}, {m,},
 *     {m,n} (n <= IFLOW_GRAMMAR_MAX_REPEAT);
 *   - "" (or an empty alternative) matches nothing.
 *   Left recursion (a rule that can reach itself before consuming a byte) is refused: the
 *   recognizer below is top-down.
 *
 * The recognizer works on bytes: a class of code points is compiled into alternatives of UTF-8
 * byte ranges, so a token that ends inside a character needs no special case, and text that is
 * not valid UTF-8 never matches. A state is a set of stacks (the nondeterministic pushdown
 * automaton of the grammar, as llama.cpp's): each stack is the list of what is left to match,
 * innermost first, its frames interned so that a stack is one integer and equal stacks are one.
 *
 * Contract
 *   iflow_grammar_open() parses and compiles GBNF text; the grammar is immutable after, and
 *   one grammar serves any number of states (threads may share it only if each has its own
 *   state and no state is advanced on two threads at once). Errors are IFLOW_EINVAL with
 *   "<what>, line L column C" (a name never defined, a bad escape, left recursion, ...), and
 *   IFLOW_ERANGE for a grammar over the size limits (IFLOW_GRAMMAR_MAX_TEXT bytes; 2^22 elements
 *   or 2^20 rules once repetitions are expanded).
 *   iflow_gstate_open() starts a sentence; _advance() consumes bytes (all or none: a state that
 *   would reject them is left unchanged and IFLOW_EINVAL returned); _can_end() says whether the
 *   bytes so far are a whole sentence; _is_done() whether nothing more can follow.
 *   _advance_token() consumes one token of a vocabulary: its bytes, or a token reference on top
 *   that it passes (both, where both stacks exist); a token reference is looked up in the
 *   vocabulary given, and iflow_grammar_check_vocab() says, before any state uses one, whether
 *   every reference names a token of it (IFLOW_EINVAL naming the reference, line and column).
 *   The vocabulary (iflow_gvocab, built once per tokenizer from each token's decoded bytes,
 *   tokenizer.h's iflow_tokenizer_piece) lets a state say which tokens may come next:
 *   _mask() walks the vocabulary's byte trie once, pruning a subtree as soon as no stack
 *   survives its prefix, then adds the tokens a token reference on top of a stack passes.
 *   Tokens that decode to no bytes (control tokens) are allowed only so; the end-of-sequence
 *   tokens are for the caller to allow when _can_end() says so (or a token reference names one:
 *   _token_allows()).
 *   A state's memory grows with what the stacks hold (nesting depth), bounded by
 *   IFLOW_GRAMMAR_MAX_FRAMES interned frames and IFLOW_GRAMMAR_MAX_STACKS live stacks: past
 *   either, _advance() and _mask() fail with IFLOW_ERANGE naming the limit (an ambiguous
 *   grammar that would otherwise explode).
 *
 * Converters (text in, GBNF out, malloc'd; IFLOW_EINVAL naming the place on bad input):
 *   iflow_grammar_from_regex()        a regular expression (Python re / ECMAScript subset):
 *                                     grammar_regex.c says which;
 *   iflow_grammar_from_json_schema()  a JSON Schema (the subset grammar_schema.c lists), or
 *                                     NULL/"{}" for any JSON value; its root rule is "root".
 */
#ifndef IFLOW_GRAMMAR_H
#define IFLOW_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "include/iflow.h"
#include "libcore/tokenizers/tokenizer.h"

#define IFLOW_GRAMMAR_MAX_TEXT   (4u << 20)  /* bytes of GBNF (and of a schema or regex)    */
#define IFLOW_GRAMMAR_MAX_REPEAT 10000       /* n of {m,n}                                  */
#define IFLOW_GRAMMAR_MAX_FRAMES (1u << 22)  /* interned stack frames of one state          */
#define IFLOW_GRAMMAR_MAX_STACKS 65536       /* stacks alive in one state                   */

/* iflow_grammar and its open/close/from_json_schema/from_regex are also the public header's
 * (include/iflow.h). */
typedef struct iflow_grammar iflow_grammar;
typedef struct iflow_gstate iflow_gstate;
typedef struct iflow_gvocab iflow_gvocab;

/* text [len] GBNF; root NULL for "root". */
int  iflow_grammar_open(iflow_grammar **out, const char *text, size_t len, const char *root);
void iflow_grammar_close(iflow_grammar *g);
/* One more owner: each iflow_grammar_close() drops one, the last frees it (atomically: owners
 * on several threads may take and drop references). */
iflow_grammar *iflow_grammar_ref(iflow_grammar *g);

/* Whole-string test: 1 if text [n] is a sentence of g, 0 if not; *prefix (may be NULL) = 1 when
 * it is a prefix of one (a sentence included). < 0 on error (IFLOW_ENOMEM, IFLOW_ERANGE). */
int  iflow_grammar_match(const iflow_grammar *g, const char *text, size_t n, int *prefix);

int  iflow_gstate_open(iflow_gstate **out, const iflow_grammar *g);
void iflow_gstate_close(iflow_gstate *s);
/* Consume bytes [n]: 0, or IFLOW_EINVAL (the grammar rejects them; s unchanged), IFLOW_ERANGE. */
int  iflow_gstate_advance(iflow_gstate *s, const char *bytes, size_t n);
/* 1 if bytes [n] may come next (s unchanged), 0 if not, < 0 on error. */
int  iflow_gstate_test(iflow_gstate *s, const char *bytes, size_t n);
/* 1 if the bytes consumed so far make a whole sentence. */
int  iflow_gstate_can_end(const iflow_gstate *s);
/* 1 if no byte can follow (a sentence is complete and cannot go on). */
int  iflow_gstate_is_done(const iflow_gstate *s);

/* The same for one token of v: id, its bytes [n] as its piece at this place. */
int  iflow_gstate_advance_token(iflow_gstate *s, const iflow_gvocab *v, int32_t id, const char *bytes, size_t n);
int  iflow_gstate_test_token(iflow_gstate *s, const iflow_gvocab *v, int32_t id, const char *bytes, size_t n);
/* 1 if a token reference on top of a stack lets token id pass next (its bytes aside). */
int  iflow_gstate_token_allows(const iflow_gstate *s, const iflow_gvocab *v, int32_t id);

int  iflow_gvocab_open(iflow_gvocab **out, const iflow_tokenizer *tok);
void iflow_gvocab_close(iflow_gvocab *v);
int32_t iflow_gvocab_n(const iflow_gvocab *v);
/* 0 when every token reference of g names a token of v; IFLOW_EINVAL naming the first that does not. */
int  iflow_grammar_check_vocab(const iflow_grammar *g, const iflow_gvocab *v);
/* allowed [n_vocab] = 1 for each token whose bytes s accepts next, else 0. Returns how many are
 * allowed (>= 0), or < 0 (IFLOW_ERANGE, IFLOW_ENOMEM). */
int  iflow_gstate_mask(iflow_gstate *s, const iflow_gvocab *v, uint8_t *allowed);
/* 1 if token id is accepted next (its bytes, or a token reference), 0 if not, < 0 on error. */
int  iflow_gstate_allows(iflow_gstate *s, const iflow_gvocab *v, int32_t id);

/* GBNF for exactly one of the texts choices [n] (lens [n] bytes each; UTF-8): vLLM's
 * guided_choice. */
int  iflow_grammar_from_choices(const char *const *choices, const size_t *lens, int n, char **out);
/* Its grammar, opened. */
int  iflow_grammar_open_choices(iflow_grammar **out, const char *const *choices, const size_t *lens, int n);

/* A grammar from text of one kind: GBNF, a JSON Schema (NULL text: any JSON value) or a regex. */
enum { IFLOW_GRAMMAR_GBNF = 0, IFLOW_GRAMMAR_JSON_SCHEMA, IFLOW_GRAMMAR_REGEX };
int  iflow_grammar_open_as(iflow_grammar **out, int kind, const char *text, size_t len);

/* GBNF rules for regex re [len] (matched whole: no anchors needed), the first rule named
 * `name` and any others `name`-something; *out malloc'd, NUL-terminated. */
int  iflow_grammar_from_regex(const char *re, size_t len, const char *name, char **out);
/* A whole GBNF grammar (root rule "root") for JSON text valid under schema [len] (JSON text;
 * NULL or "{}": any JSON value; {"type":"object"}: any object, OpenAI's json_object mode). */
int  iflow_grammar_from_json_schema(const char *schema, size_t len, char **out);

#endif
