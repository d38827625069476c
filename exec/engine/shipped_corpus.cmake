# Writes OUT, a C++ source holding IN's bytes as memwall::exec::kShippedCorpus (run_config.hpp), so
# the corpus memwall ships is inside the program and no source-tree path is compiled in.
# cmake -DIN=corpus.txt -DOUT=shipped_corpus.cpp -P shipped_corpus.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," chars "${hex}")
string(REGEX REPLACE "(('\\\\x..',){16})" "\\1\n" chars "${chars}")
file(WRITE "${OUT}.tmp" "// generated from exec/data/corpus.txt by exec/engine/shipped_corpus.cmake; do not edit\n"
     "#include \"exec/engine/run_config.hpp\"\n"
     "namespace memwall::exec {\nnamespace {\nconst char kBytes[${bytes}] = {\n${chars}};\n}  // namespace\n"
     "const std::string_view kShippedCorpus(kBytes, sizeof kBytes);\n}  // namespace memwall::exec\n")
file(RENAME "${OUT}.tmp" "${OUT}")
