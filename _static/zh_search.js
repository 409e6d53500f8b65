/* The Chinese edition's search query, split as its index is.

   Sphinx indexes Chinese as jieba cuts it (tools/i18n.py gives jieba the book's terms and the
   words of its titles), but searchtools.js splits a query only at spaces and punctuation:
   "KV缓存" or "恢复训练", typed without a space as Chinese is, is looked up as one word, which
   the index does not hold, and nothing is found. Here each run of Chinese characters in a
   query is cut into the longest words the index holds, from the left (forward maximum
   matching against Search._index.terms and .titleterms): "KV缓存" -> "KV" + "缓存", "恢复训练"
   -> "恢复" + "训练". A character that starts no indexed word is dropped, as the index drops
   single characters (a query term that matches nothing would leave every page out).

   searchtools.js defines its own splitQuery only `if (typeof splitQuery === "undefined")`;
   this file comes before it (Jupyter Book adds the scripts of _static to every page, ahead of
   the search's). The English book loads it too, and keeps Sphinx's splitQuery. */
if (/^zh/i.test(document.documentElement.lang)) {
  var splitQuery = (query) => {
    // Sphinx's own split first: at anything that is not a letter, a digit or "_"
    const words = query
      .split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu)
      .filter((word) => word);
    const index = typeof Search === "undefined" ? null : Search._index;
    if (!index) return words;
    const has = (table, word) => Object.prototype.hasOwnProperty.call(table || {}, word);
    const indexed = (word) => has(index.terms, word) || has(index.titleterms, word);
    const out = [];
    for (const word of words) {
      for (const run of word.match(/\p{Script=Han}+|[^\p{Script=Han}]+/gu)) {
        if (!/\p{Script=Han}/u.test(run) || indexed(run)) {
          out.push(run);
          continue;
        }
        let start = 0;
        while (start < run.length) {
          let end = run.length;
          while (end > start + 1 && !indexed(run.slice(start, end))) end--;
          if (end > start + 1) out.push(run.slice(start, end));
          start = end;
        }
      }
    }
    return out;
  };
}
