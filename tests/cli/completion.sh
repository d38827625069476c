#!/bin/bash
# completion.sh MEMWALL: the generated bash completion completes subcommands, a subcommand's flags
# (not the ones it refuses) and catalogue names, as bash would call it.
set -e
mw="$1"
source <("$mw" completion bash)
complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=(); _memwall; echo "${COMPREPLY[*]}"; }
[ "$(complete_words memwall simu)" = "simulate" ] || { echo "subcommand: $(complete_words memwall simu)"; exit 1; }
[ "$(complete_words memwall simulate --strat)" = "--strategy" ] || { echo "flag: $(complete_words memwall simulate --strat)"; exit 1; }
case " $(complete_words memwall run --o) " in *" --onebit-adam "*) echo "run offers --onebit-adam, which it refuses"; exit 1;; esac
case " $(complete_words memwall run --p) " in *" --pp "*) ;; *) echo "run does not offer --pp, which it runs"; exit 1;; esac
[ "$(complete_words memwall plan --megat)" = "--megatron" ] || { echo "plan --megatron missing"; exit 1; }
case " $(complete_words memwall analyze --model table1-1) " in *" table1-10B "*) ;; *) echo "models: $(complete_words memwall analyze --model table1-1)"; exit 1;; esac
[ "$(complete_words memwall plan --profile dgx-h)" = "dgx-h100" ] || { echo "profiles"; exit 1; }
echo "completion ok"
