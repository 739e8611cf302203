#!/usr/bin/env bash
# Sourced by run_train.sh before it changes into the checkout: relative paths mean paths from
# where the user stands. Those given on the command line or in environment variables are made
# absolute here against the directory the user ran the script from; TTL_LAUNCH_DIR tells the
# trainer that directory, against which it resolves the path keys written inside a TOML
# (torchtitan_like/config/paths.py; `extends` names files relative to the TOML itself).
# Path keys: those whose value names a file or folder of the user's.
#   user_path PATH             -> PATH, absolute against $USER_DIR when relative
#   user_args ARGS...          -> USER_ARGS, the overrides with path values made absolute

USER_DIR="$PWD"
export TTL_LAUNCH_DIR="$USER_DIR"
_PATH_KEYS=" job.config_file job.dump_folder compile.cache_dir checkpoint.initial_load_path "
_IF_PRESENT_KEYS=" training.dataset_path model.tokenizer_path "  # else a hub name: kept

user_path() {
  if [[ -z "$1" || "$1" = /* ]]; then echo "$1"; else echo "$USER_DIR/$1"; fi
}

_user_value() {  # key value -> the value, with its path(s) made absolute
  local key="$1" value="$2"
  if [[ "$_PATH_KEYS" == *" $key "* ]]; then
    user_path "$value"
  elif [[ "$_IF_PRESENT_KEYS" == *" $key "* && -e "$USER_DIR/$value" ]]; then
    user_path "$value"
  elif [[ "$key" == job.custom_import ]]; then  # files (*.py) among module names
    local out="" item
    IFS=',' read -ra items <<< "$value"
    for item in "${items[@]}"; do
      [[ "$item" == *.py ]] && item="$(user_path "$item")"
      out="${out:+$out,}$item"
    done
    echo "$out"
  elif [[ "$key" == job.trainer && "$value" == *.py:* ]]; then  # a file's class: file:Class
    echo "$(user_path "${value%:*}"):${value##*:}"
  else
    echo "$value"
  fi
}

user_args() {
  USER_ARGS=()
  while [[ $# -gt 0 ]]; do
    local arg="$1" key
    shift
    if [[ "$arg" == --*=* ]]; then
      key="${arg%%=*}"
      USER_ARGS+=("$key=$(_user_value "${key#--}" "${arg#*=}")")
    elif [[ "$arg" == --* && $# -gt 0 && "$1" != --* ]]; then
      USER_ARGS+=("$arg" "$(_user_value "${arg#--}" "$1")")
      shift
    else
      USER_ARGS+=("$arg")
    fi
  done
}
