/* Checkpoint folders in the Hugging Face layout and flat-buffer tensor files (checkpoint.h).
 * Saving goes through a temporary sibling folder renamed into place, so a reader never sees a
 * half-written checkpoint; loading checks every tensor against the model's parameter table. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lora.h"
#include "safetensors.h"
#include "sha256.h"

#define CONFIG_MAX ((size_t)16 << 20)     /* config.json, generation_config.json, the index */
#define TOKENIZER_MAX ((size_t)256 << 20) /* tokenizer.json */

static int join(char *buf, size_t cap, const char *dir, const char *name, struct dapo_err *e) {
  int n = snprintf(buf, cap, "%s/%s", dir, name);
  if (n < 0 || (size_t)n >= cap)
    return dapo_errf(e, DAPO_EINVAL, "path too long: '%.200s/%s'", dir, name);
  return 0;
}

static int path_exists(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

/* Reads a whole regular file of at most cap bytes into an owned NUL-terminated buffer. */
static int read_file(const char *path, const char *label, size_t cap, char **out, size_t *len,
                     struct dapo_err *e) {
  int rc = 0;
  char *buf = NULL;
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return dapo_errf(e, DAPO_EIO, "%s: cannot open: %s", label, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    rc = dapo_errf(e, DAPO_EIO, "%s: not a readable regular file", label);
    goto out;
  }
  if ((uint64_t)sb.st_size > cap) {
    rc = dapo_errf(e, DAPO_ERANGE, "%s: %" PRIu64 " bytes exceeds the limit of %zu", label,
                   (uint64_t)sb.st_size, cap);
    goto out;
  }
  size_t size = (size_t)sb.st_size, got = 0;
  buf = malloc(size + 1);
  if (!buf) {
    rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
    goto out;
  }
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = dapo_errf(e, DAPO_EIO, "%s: read failed: %s", label,
                     r < 0 ? strerror(errno) : "file shrank while reading");
      goto out;
    }
    got += (size_t)r;
  }
  buf[size] = '\0';
  *out = buf;
  *len = size;
  buf = NULL;
out:
  free(buf);
  close(fd);
  return rc;
}

static int load_json(const char *path, const char *label, json_t **out, struct dapo_err *e) {
  char *text = NULL;
  size_t len = 0;
  *out = NULL;
  int rc = read_file(path, label, CONFIG_MAX, &text, &len, e);
  if (rc) return rc;
  json_error_t jerr;
  *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  if (!*out)
    return dapo_errf(e, DAPO_EFORMAT, "%s: not valid JSON (line %d, column %d: %s)", label,
                     jerr.line, jerr.column, jerr.text);
  return 0;
}

/* Creates path (must not exist), writes len bytes and fsyncs it. */
static int write_file_sync(const char *path, const char *label, const char *data, size_t len,
                           struct dapo_err *e) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return dapo_errf(e, DAPO_EIO, "%s: cannot create: %s", label, strerror(errno));
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, data + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) goto fail;
    done += (size_t)w;
  }
  if (fsync(fd) != 0) goto fail;
  if (close(fd) != 0) {
    fd = -1;
    goto fail;
  }
  return 0;
fail:;
  int err = errno;
  if (fd >= 0) close(fd);
  return dapo_errf(e, DAPO_EIO, "%s: write failed: %s", label, err ? strerror(err) : "no space");
}

static int write_json_sync(const char *path, const char *label, const json_t *j,
                           struct dapo_err *e) {
  char *s = json_dumps(j, JSON_INDENT(2));
  if (!s) return dapo_errf(e, DAPO_ENOMEM, "%s: cannot encode JSON", label);
  size_t n = strlen(s);
  char *t = realloc(s, n + 2);
  if (!t) {
    free(s);
    return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
  }
  t[n] = '\n';
  t[n + 1] = '\0';
  int rc = write_file_sync(path, label, t, n + 1, e);
  free(t);
  return rc;
}

static int fsync_dir(const char *dir, struct dapo_err *e) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return dapo_errf(e, DAPO_EIO, "cannot open folder '%.200s': %s", dir, strerror(errno));
  int rc = 0;
  if (fsync(fd) != 0)
    rc = dapo_errf(e, DAPO_EIO, "cannot fsync folder '%.200s': %s", dir, strerror(errno));
  close(fd);
  return rc;
}

/* The folder that holds path ("." when path has no slash). */
static void parent_of(const char *path, char *out, size_t cap) {
  const char *s = strrchr(path, '/');
  if (!s)
    snprintf(out, cap, ".");
  else if (s == path)
    snprintf(out, cap, "/");
  else
    snprintf(out, cap, "%.*s", (int)(s - path), path);
}

/* Removes a checkpoint folder we created: the files in it (ours, and those of the extra hook),
 * then the folder (best effort; the folder only ever holds plain files). */
static void remove_ckpt_dir(const char *dir) {
  char p[PATH_MAX];
  DIR *dh = opendir(dir);
  if (dh) {
    struct dirent *de;
    while ((de = readdir(dh)))
      if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
          join(p, sizeof p, dir, de->d_name, NULL) == 0)
        unlink(p);
    closedir(dh);
  }
  rmdir(dir);
}

int ckpt_remove_temporaries(const char *dir) {
  DIR *dh = opendir(dir);
  if (!dh) return 0;
  int n = 0;
  struct dirent *de;
  char p[PATH_MAX];
  while ((de = readdir(dh))) {
    size_t len = strlen(de->d_name);
    int tmp =
        strstr(de->d_name, ".tmp-") != NULL || (len > 4 && !strcmp(de->d_name + len - 4, ".tmp"));
    if (!tmp || join(p, sizeof p, dir, de->d_name, NULL)) continue;
    struct stat st;
    if (lstat(p, &st)) continue;
    if (S_ISDIR(st.st_mode))
      remove_ckpt_dir(p);
    else
      unlink(p);
    n++;
  }
  closedir(dh);
  return n;
}

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The file's shape equals the table row's; otherwise an error naming both. */
static int check_shape(const char *label, const struct st_info *t, const struct param_info *p,
                       struct dapo_err *e) {
  int same = t->ndim == p->ndim;
  for (int i = 0; same && i < p->ndim; i++) same = t->shape[i] == p->shape[i];
  if (same) return 0;
  char a[160], b[64];
  fmt_shape(a, sizeof a, t->ndim, t->shape);
  fmt_shape(b, sizeof b, p->ndim, p->shape);
  return dapo_errf(e, DAPO_EFORMAT,
                   "%s: tensor '%.200s': shape %s in the file but config.json implies %s", label,
                   t->name, a, b);
}

/* ---- saving ---- */

int ckpt_save(const char *dir, const struct model *m, const char *tokenizer_json,
              const json_t *generation_config, int bf16, struct dapo_err *e) {
  return ckpt_save_with(dir, m, tokenizer_json, generation_config, bf16, NULL, NULL, e);
}

int ckpt_write_json(const char *path, const json_t *j, struct dapo_err *e) {
  const char *base = strrchr(path, '/');
  return write_json_sync(path, base ? base + 1 : path, j, e);
}

/* What a folder's weights are: a model's (config.json and model.safetensors) or an adapter's
 * (lora_save's two files and LORA_BASE_FILE). */
struct weights_src {
  const struct model *m; /* its config also gives the default generation_config.json */
  const struct lora *lora;
  const json_t *base; /* the adapter's LORA_BASE_FILE object */
  int bf16;
};

static int write_weights(const struct weights_src *w, const char *tmp, struct dapo_err *e) {
  char p[PATH_MAX];
  int rc = 0;
  if (w->lora) {
    const char *base = json_string_value(json_object_get(w->base, "model"));
    if ((rc = lora_save(w->lora, tmp, base, e)) ||
        (rc = join(p, sizeof p, tmp, LORA_BASE_FILE, e)) ||
        (rc = write_json_sync(p, LORA_BASE_FILE, w->base, e)))
      return rc;
    return 0;
  }
  const struct model *m = w->m;
  json_t *cfg = model_config_to_json(&m->cfg, w->bf16 ? "bfloat16" : "float32");
  struct st_tensor_in *ts = calloc((size_t)(m->n_tensors ? m->n_tensors : 1), sizeof *ts);
  json_t *meta = json_pack("{s:s}", "format", "pt");
  if (!cfg || !ts || !meta) {
    rc = dapo_errf(e, DAPO_ENOMEM, "model.safetensors: out of memory");
    goto out;
  }
  if ((rc = join(p, sizeof p, tmp, "config.json", e)) ||
      (rc = write_json_sync(p, "config.json", cfg, e)))
    goto out;
  for (int i = 0; i < m->n_tensors; i++) {
    const struct param_info *r = &m->tensors[i];
    ts[i].name = r->name;
    ts[i].data = m->params + r->offset;
    ts[i].ndim = r->ndim;
    for (int k = 0; k < r->ndim; k++) ts[i].shape[k] = r->shape[k];
  }
  if ((rc = join(p, sizeof p, tmp, "model.safetensors", e)) ||
      (rc = st_write(p, ts, m->n_tensors, w->bf16 ? ST_BF16 : ST_F32, meta, e)))
    goto out;
out:
  json_decref(meta);
  json_decref(cfg);
  free(ts);
  return rc;
}

/* The atomic folder both savers write: weights, tokenizer, generation config, extra files. */
static int save_folder(const char *dir, const struct weights_src *w, const char *tokenizer_json,
                       const json_t *generation_config, ckpt_extra_fn extra, void *extra_ctx,
                       struct dapo_err *e) {
  int rc = 0, created = 0, renamed = 0;
  char d[PATH_MAX], tmp[PATH_MAX], parent[PATH_MAX], p[PATH_MAX];
  json_t *gen = NULL;
  const struct model *m = w->m;

  size_t dl = strlen(dir);
  while (dl > 1 && dir[dl - 1] == '/') dl--;
  if (dl == 0 || dl >= sizeof d - 32)
    return dapo_errf(e, DAPO_EINVAL, "checkpoint folder '%.200s': empty or too long", dir);
  memcpy(d, dir, dl);
  d[dl] = '\0';
  if (path_exists(d))
    return dapo_errf(e, DAPO_EINVAL, "checkpoint folder '%.200s' already exists", d);
  parent_of(d, parent, sizeof parent);
  int tl = snprintf(tmp, sizeof tmp, "%s.tmp-%ld-XXXXXX", d, (long)getpid());
  if (tl < 0 || (size_t)tl >= sizeof tmp || !mkdtemp(tmp))
    return dapo_errf(e, DAPO_EIO, "cannot create a temporary folder beside '%.200s': %s", d,
                     strerror(errno));
  created = 1;

  if ((rc = write_weights(w, tmp, e))) goto out;

  if (tokenizer_json &&
      ((rc = join(p, sizeof p, tmp, "tokenizer.json", e)) ||
       (rc = write_file_sync(p, "tokenizer.json", tokenizer_json, strlen(tokenizer_json), e))))
    goto out;

  if (!generation_config) {
    gen = json_object();
    if (!gen) {
      rc = dapo_errf(e, DAPO_ENOMEM, "generation_config.json: out of memory");
      goto out;
    }
    json_object_set_new(gen, "bos_token_id",
                        m->cfg.bos_token_id >= 0 ? json_integer(m->cfg.bos_token_id) : json_null());
    json_object_set_new(gen, "eos_token_id",
                        m->cfg.eos_token_id >= 0 ? json_integer(m->cfg.eos_token_id) : json_null());
  }
  if ((rc = join(p, sizeof p, tmp, "generation_config.json", e)) ||
      (rc = write_json_sync(p, "generation_config.json", gen ? gen : generation_config, e)))
    goto out;

  if (extra && (rc = extra(extra_ctx, tmp, e))) goto out;
  if ((rc = fsync_dir(tmp, e))) goto out;
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, d, RENAME_NOREPLACE) != 0) {
    int err = errno;
    if (err == EINVAL || err == ENOSYS) { /* filesystem without RENAME_NOREPLACE */
      if (path_exists(d))
        err = EEXIST;
      else
        err = rename(tmp, d) == 0 ? 0 : errno;
    }
    if (err == EEXIST || err == ENOTEMPTY) {
      rc = dapo_errf(e, DAPO_EINVAL, "checkpoint folder '%.200s' already exists", d);
      goto out;
    }
    if (err) {
      rc = dapo_errf(e, DAPO_EIO, "cannot rename the temporary folder to '%.200s': %s", d,
                     strerror(err));
      goto out;
    }
  }
  renamed = 1;
  if ((rc = fsync_dir(parent, e))) goto out;

out:
  if (rc && created) remove_ckpt_dir(renamed ? d : tmp);
  json_decref(gen);
  return rc;
}

int ckpt_save_with(const char *dir, const struct model *m, const char *tokenizer_json,
                   const json_t *generation_config, int bf16, ckpt_extra_fn extra, void *extra_ctx,
                   struct dapo_err *e) {
  struct weights_src w = {.m = m, .bf16 = bf16};
  return save_folder(dir, &w, tokenizer_json, generation_config, extra, extra_ctx, e);
}

int ckpt_save_adapter(const char *dir, const struct model *m, const json_t *base,
                      const char *tokenizer_json, const json_t *generation_config,
                      ckpt_extra_fn extra, void *extra_ctx, struct dapo_err *e) {
  if (!m->lora || !json_string_value(json_object_get(base, "model")))
    return dapo_errf(e, DAPO_EINVAL, "ckpt_save_adapter: no adapter, or no base model named");
  struct weights_src w = {.m = m, .lora = m->lora, .base = base};
  return save_folder(dir, &w, tokenizer_json, generation_config, extra, extra_ctx, e);
}

const char *const ckpt_file_names[CKPT_N_FILES] = {
    "config.json",           "model.safetensors",
    "adapter_config.json",   "adapter_model.safetensors",
    LORA_BASE_FILE,          "tokenizer.json",
    "tokenizer_config.json", "generation_config.json",
    "optimizer.safetensors", "trainer_weights.safetensors",
    "trainer_state.json"};

int ckpt_manifest_read(const char *dir, struct ckpt_manifest *m, struct dapo_err *e) {
  enum { CHUNK = 1 << 16 };
  memset(m, 0, sizeof *m);
  char *buf = malloc(CHUNK);
  if (!buf) return dapo_errf(e, DAPO_ENOMEM, "out of memory");
  int rc = 0;
  for (int i = 0; i < CKPT_N_FILES && !rc; i++) {
    char p[PATH_MAX];
    if ((rc = join(p, sizeof p, dir, ckpt_file_names[i], e))) break;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) continue; /* an optional file this checkpoint does not have */
      rc = dapo_errf(e, DAPO_EIO, "%s: %s", p, strerror(errno));
      break;
    }
    struct dapo_sha256 c;
    dapo_sha256_begin(&c);
    int64_t n = 0;
    for (;;) {
      ssize_t k = read(fd, buf, CHUNK);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) {
        rc = dapo_errf(e, DAPO_EIO, "%s: %s", p, strerror(errno));
        break;
      }
      if (k == 0) break;
      dapo_sha256_feed(&c, buf, (size_t)k);
      n += k;
    }
    close(fd);
    if (rc) break;
    struct ckpt_file *f = &m->files[m->n++];
    f->name = ckpt_file_names[i];
    f->bytes = n;
    dapo_sha256_end_hex(&c, f->sha256);
  }
  free(buf);
  return rc;
}

/* ---- loading ---- */

static int cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Model tensor names sorted for bsearch (borrowed from m). */
static const char **sorted_names(const struct model *m) {
  const char **v = malloc((size_t)(m->n_tensors ? m->n_tensors : 1) * sizeof *v);
  if (!v) return NULL;
  for (int i = 0; i < m->n_tensors; i++) v[i] = m->tensors[i].name;
  qsort(v, (size_t)m->n_tensors, sizeof *v, cmp_str_ptr);
  return v;
}

static int has_name(const char **sorted, int n, const char *name) {
  return bsearch(&name, sorted, (size_t)n, sizeof *sorted, cmp_str_ptr) != NULL;
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

/* Tensors transformers also leaves out of the model: RoPE buffers, a tied lm_head. */
static int ignorable(const struct model *m, const char *name) {
  return ends_with(name, ".rotary_emb.inv_freq") ||
         (m->cfg.tie_word_embeddings && !strcmp(name, "lm_head.weight"));
}

struct shard {
  const char *name; /* borrowed from the index JSON or a literal */
  struct st_file *f;
};

static int check_expected(const struct model *m, const char **sorted, const char *label,
                          const char *name, struct dapo_err *e) {
  if (ignorable(m, name) || has_name(sorted, m->n_tensors, name)) return 0;
  return dapo_errf(e, DAPO_EFORMAT, "%s: unexpected tensor '%.200s'", label, name);
}

/* Validates the index and opens every shard it names (at most one handle per file). */
static int open_shards(const char *dir, json_t *index, struct shard **out, int *n_out,
                       struct dapo_err *e) {
  const char *label = "model.safetensors.index.json";
  json_t *wm = json_object_get(index, "weight_map");
  *out = NULL;
  *n_out = 0;
  if (!json_is_object(wm))
    return dapo_errf(e, DAPO_EFORMAT, "%s: \"weight_map\" missing or not an object", label);
  size_t cap = json_object_size(wm);
  struct shard *sh = calloc(cap ? cap : 1, sizeof *sh);
  if (!sh) return dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
  int n = 0, rc = 0;
  const char *k;
  json_t *v;
  json_object_foreach(wm, k, v) {
    const char *s = json_string_value(v);
    if (!s || !s[0] || strchr(s, '/') || strstr(s, "..") || strlen(s) > 255) {
      rc = dapo_errf(e, DAPO_EFORMAT,
                     "%s: tensor '%.200s': shard '%.100s' is not a plain file name in the folder",
                     label, k, s ? s : "(not a string)");
      goto out;
    }
    int seen = 0;
    for (int i = 0; i < n && !seen; i++) seen = !strcmp(sh[i].name, s);
    if (!seen) sh[n++].name = s;
  }
  for (int i = 0; i < n; i++) {
    char p[PATH_MAX];
    if ((rc = join(p, sizeof p, dir, sh[i].name, e)) || (rc = st_open(p, &sh[i].f, e))) goto out;
  }
out:
  *out = sh;
  *n_out = n;
  return rc;
}

/* ckpt_load, or with frozen ckpt_load_frozen. */
static int load(const char *dir, int frozen, struct model **out, char **tokenizer_json,
                struct dapo_err *e) {
  int rc = 0, n_shards = 0;
  char p[PATH_MAX];
  json_t *cfg_j = NULL, *index = NULL;
  struct model *m = NULL;
  struct shard *shards = NULL;
  const char **names = NULL;
  struct src {
    const struct st_info *t;
    const struct shard *sh;
  } *src = NULL; /* where each row of the table is stored */
  char *tok = NULL;
  size_t tok_len = 0;
  *out = NULL;
  if (tokenizer_json) *tokenizer_json = NULL;

  struct model_config cfg;
  if ((rc = join(p, sizeof p, dir, "config.json", e)) ||
      (rc = load_json(p, "config.json", &cfg_j, e)) ||
      (rc = model_config_from_json(&cfg, cfg_j, e)))
    goto out;
  /* the frozen layout allocates without touching: it costs nothing to drop if the file's
   * matrices turn out not to be BF16 */
  if (!(m = frozen && cfg.bf16_weights ? model_new_frozen_bf16(&cfg, e) : model_new(&cfg, e))) {
    rc = e ? e->code : DAPO_ENOMEM;
    goto out;
  }

  if ((rc = join(p, sizeof p, dir, "model.safetensors", e))) goto out;
  if (path_exists(p)) {
    shards = calloc(1, sizeof *shards);
    if (!shards) {
      rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
      goto out;
    }
    shards[0].name = "model.safetensors";
    n_shards = 1;
    if ((rc = st_open(p, &shards[0].f, e))) goto out;
  } else {
    if ((rc = join(p, sizeof p, dir, "model.safetensors.index.json", e))) goto out;
    if (!path_exists(p)) {
      rc = dapo_errf(e, DAPO_EIO,
                     "'%.200s' holds neither model.safetensors nor model.safetensors.index.json",
                     dir);
      goto out;
    }
    if ((rc = load_json(p, "model.safetensors.index.json", &index, e)) ||
        (rc = open_shards(dir, index, &shards, &n_shards, e)))
      goto out;
  }

  if (!(names = sorted_names(m))) {
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
    goto out;
  }
  json_t *wm = json_object_get(index, "weight_map"); /* NULL without an index */
  const char *k;
  json_t *v;
  json_object_foreach(wm, k, v) {
    if ((rc = check_expected(m, names, "model.safetensors.index.json", k, e))) goto out;
  }
  for (int s = 0; s < n_shards; s++)
    for (int i = 0; i < st_count(shards[s].f); i++)
      if ((rc = check_expected(m, names, shards[s].name, st_at(shards[s].f, i)->name, e))) goto out;

  if (!(src = calloc((size_t)m->n_tensors, sizeof *src))) {
    rc = dapo_errf(e, DAPO_ENOMEM, "out of memory");
    goto out;
  }
  int all_bf16 = 1; /* every matrix stored in BF16 */
  for (int i = 0; i < m->n_tensors; i++) {
    const struct param_info *r = &m->tensors[i];
    const struct shard *sh = &shards[0];
    if (index) {
      const char *file = json_string_value(json_object_get(wm, r->name));
      if (!file) {
        rc = dapo_errf(e, DAPO_EFORMAT, "model.safetensors.index.json: missing tensor '%.200s'",
                       r->name);
        goto out;
      }
      for (int s = 0; s < n_shards; s++)
        if (!strcmp(shards[s].name, file)) sh = &shards[s];
    }
    const struct st_info *t = st_find(sh->f, r->name);
    if (!t) {
      rc = dapo_errf(e, DAPO_EFORMAT, "%s: missing tensor '%.200s'", sh->name, r->name);
      goto out;
    }
    if ((rc = check_shape(sh->name, t, r, e))) goto out;
    src[i] = (struct src){t, sh};
    if (r->ndim == 2 && t->dtype != ST_BF16) all_bf16 = 0;
  }
  if (m->w16 && !all_bf16) { /* float32 after all (the caller may still freeze exact values) */
    model_free(m);
    if (!(m = model_new(&cfg, e))) {
      rc = e ? e->code : DAPO_ENOMEM;
      goto out;
    }
  }
  for (int i = 0; i < m->n_tensors; i++) {
    const struct param_info *r = &m->tensors[i];
    if (m->w16 && r->ndim == 2) /* the file's bits are the BF16 values */
      rc = st_read_raw(src[i].sh->f, src[i].t, m->w16 + r->offset, r->numel * sizeof *m->w16, e);
    else
      rc = st_read_f32(src[i].sh->f, src[i].t, m->params + r->offset, r->numel, e);
    if (rc) goto out;
  }

  if (tokenizer_json) {
    if ((rc = join(p, sizeof p, dir, "tokenizer.json", e))) goto out;
    if (path_exists(p) && (rc = read_file(p, "tokenizer.json", TOKENIZER_MAX, &tok, &tok_len, e)))
      goto out;
  }

out:
  for (int s = 0; s < n_shards; s++) st_close(shards[s].f);
  free(shards);
  free(names);
  free(src);
  json_decref(index);
  json_decref(cfg_j);
  if (rc) {
    model_free(m);
    free(tok);
    return rc;
  }
  model_weights_changed(m);
  *out = m;
  if (tokenizer_json) *tokenizer_json = tok;
  return 0;
}

int ckpt_load(const char *dir, struct model **out, char **tokenizer_json, struct dapo_err *e) {
  return load(dir, 0, out, tokenizer_json, e);
}

int ckpt_load_frozen(const char *dir, struct model **out, char **tokenizer_json,
                     struct dapo_err *e) {
  return load(dir, 1, out, tokenizer_json, e);
}

/* ---- flat buffers (optimizer state) ---- */

static int check_bufs(const char *label, int nbuf, const char *const *prefixes,
                      const void *const *bufs, struct dapo_err *e) {
  if (nbuf < 0 || (nbuf > 0 && (!prefixes || !bufs)))
    return dapo_errf(e, DAPO_EINVAL, "%s: bad buffer list", label);
  for (int b = 0; b < nbuf; b++)
    if (!prefixes[b] || !bufs[b] || strlen(prefixes[b]) > 128)
      return dapo_errf(e, DAPO_EINVAL, "%s: buffer %d: missing or over-long prefix or data", label,
                       b);
  return 0;
}

int ckpt_save_tensors(const char *path, const struct model *m, int nbuf,
                      const char *const *prefixes, const float *const *bufs, const json_t *metadata,
                      struct dapo_err *e) {
  const char *label = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  int rc = check_bufs(label, nbuf, prefixes, (const void *const *)bufs, e);
  if (rc) return rc;
  size_t n = (size_t)nbuf * (size_t)m->n_tensors, stride = 128 + sizeof m->tensors[0].name;
  struct st_tensor_in *ts = calloc(n ? n : 1, sizeof *ts);
  char *arena = calloc(n ? n : 1, stride);
  char tmp[PATH_MAX], parent[PATH_MAX];
  int have_tmp = 0;
  if (!ts || !arena) {
    rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
    goto out;
  }
  for (int b = 0; b < nbuf; b++)
    for (int i = 0; i < m->n_tensors; i++) {
      const struct param_info *r = &m->tensors[i];
      size_t j = (size_t)b * (size_t)m->n_tensors + (size_t)i;
      char *nm = arena + j * stride;
      snprintf(nm, stride, "%s%s", prefixes[b], r->name);
      ts[j].name = nm;
      ts[j].data = bufs[b] + r->offset;
      ts[j].ndim = r->ndim;
      for (int k = 0; k < r->ndim; k++) ts[j].shape[k] = r->shape[k];
    }
  int len = snprintf(tmp, sizeof tmp, "%s.tmp-%ld-XXXXXX", path, (long)getpid());
  if (len < 0 || (size_t)len >= sizeof tmp) {
    rc = dapo_errf(e, DAPO_EINVAL, "%s: path too long", label);
    goto out;
  }
  int fd = mkstemp(tmp);
  if (fd < 0) {
    rc = dapo_errf(e, DAPO_EIO, "%s: cannot create a temporary file: %s", label, strerror(errno));
    goto out;
  }
  close(fd);
  have_tmp = 1;
  if ((rc = st_write(tmp, ts, (int)n, ST_F32, metadata, e))) goto out;
  if (rename(tmp, path) != 0) {
    rc = dapo_errf(e, DAPO_EIO, "%s: cannot rename into place: %s", label, strerror(errno));
    goto out;
  }
  have_tmp = 0;
  parent_of(path, parent, sizeof parent);
  rc = fsync_dir(parent, e);
out:
  if (have_tmp) unlink(tmp);
  free(arena);
  free(ts);
  return rc;
}

int ckpt_load_tensors(const char *path, const struct model *m, int nbuf,
                      const char *const *prefixes, float *const *bufs, json_t **metadata_out,
                      struct dapo_err *e) {
  const char *label = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  struct st_file *f = NULL;
  const char **names = NULL;
  if (metadata_out) *metadata_out = NULL;
  int rc = check_bufs(label, nbuf, prefixes, (const void *const *)bufs, e);
  if (rc || (rc = st_open(path, &f, e))) return rc;
  if (!(names = sorted_names(m))) {
    rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
    goto out;
  }
  for (int i = 0; i < st_count(f); i++) {
    const char *nm = st_at(f, i)->name;
    int ok = 0;
    for (int b = 0; b < nbuf && !ok; b++) {
      size_t pl = strlen(prefixes[b]);
      ok = !strncmp(nm, prefixes[b], pl) && has_name(names, m->n_tensors, nm + pl);
    }
    if (!ok) {
      rc = dapo_errf(e, DAPO_EFORMAT, "%s: unexpected tensor '%.200s'", label, nm);
      goto out;
    }
  }
  for (int b = 0; b < nbuf; b++)
    for (int i = 0; i < m->n_tensors; i++) {
      const struct param_info *r = &m->tensors[i];
      char nm[256];
      snprintf(nm, sizeof nm, "%s%s", prefixes[b], r->name);
      const struct st_info *t = st_find(f, nm);
      if (!t) {
        rc = dapo_errf(e, DAPO_EFORMAT, "%s: missing tensor '%.200s'", label, nm);
        goto out;
      }
      if (t->dtype != ST_F32) {
        rc = dapo_errf(e, DAPO_EFORMAT, "%s: tensor '%.200s': dtype %s, expected F32", label, nm,
                       st_dtype_name(t->dtype));
        goto out;
      }
      if ((rc = check_shape(label, t, r, e)) ||
          (rc = st_read_f32(f, t, bufs[b] + r->offset, r->numel, e)))
        goto out;
    }
  if (metadata_out && st_metadata(f)) {
    *metadata_out = json_deep_copy(st_metadata(f));
    if (!*metadata_out) rc = dapo_errf(e, DAPO_ENOMEM, "%s: out of memory", label);
  }
out:
  free(names);
  st_close(f);
  return rc;
}

int ckpt_remove_folder(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *de;
  char p[PATH_MAX + 320];
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
      unlink(p);
    }
  closedir(d);
  return rmdir(dir);
}
