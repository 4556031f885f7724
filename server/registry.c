/* The model registry (registry.h): presets, folders of models_dir, checkpoints of the store's
 * index. Moved out of the /v1/models handlers so that job creation, the workers and completions
 * resolve a model id through the daemon's services, not through the HTTP layer. */
#include "registry.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat.h"
#include "lm.h"
#include "log.h"
#include "parse.h"
#include "preset.h"
#include "server.h"

#define MAX_FOLDERS 1000                  /* sub-folders inspected per listing */
#define CONFIG_JSON_MAX ((size_t)1 << 20) /* config.json is small */
#define MAX_CKPT_MODELS 10000             /* checkpoints considered per listing */

/* 1 when dir/name is a regular file. */
static int is_file(const char *dir, const char *name) {
  char p[PATH_MAX + 64];
  struct stat st;
  if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p) return 0;
  return !stat(p, &st) && S_ISREG(st.st_mode);
}

/* Reads, parses and validates dir/config.json into c (its mtime into *mtime); on failure a
 * message naming the problem. */
static int read_config(const char *dir, struct model_config *c, int64_t *mtime,
                       struct dapo_err *e) {
  char p[PATH_MAX + 32];
  if ((size_t)snprintf(p, sizeof p, "%s/config.json", dir) >= sizeof p)
    return dapo_errf(e, DAPO_EINVAL, "path too long");
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) {
    int err = errno;
    if (fd >= 0) close(fd);
    return dapo_errf(e, DAPO_EIO, "config.json: %s", strerror(err));
  }
  *mtime = st.st_mtime;
  if (!S_ISREG(st.st_mode) || (size_t)st.st_size > CONFIG_JSON_MAX) {
    close(fd);
    return dapo_errf(e, DAPO_EFORMAT, "config.json: not a regular file of at most 1 MiB");
  }
  json_error_t je;
  json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
  close(fd);
  if (!j)
    return dapo_errf(e, DAPO_EFORMAT, "config.json: line %d, column %d: %s", je.line, je.column,
                     je.text);
  int rc = model_config_from_json(c, j, e);
  json_decref(j);
  if (!rc) rc = model_config_validate(c, e);
  return rc;
}

static void entry_init(struct registry_entry *out, const char *id, enum registry_kind kind) {
  memset(out, 0, sizeof *out);
  snprintf(out->id, sizeof out->id, "%s", id);
  out->kind = kind;
  out->step = -1;
}

static void preset_entry(const struct preset *p, struct registry_entry *out) {
  entry_init(out, p->name, REGISTRY_PRESET);
  out->ready = 1;
  out->preset = p;
  out->cfg = p->cfg;
  snprintf(out->path, sizeof out->path, "%s", p->name);
}

/* The entry of folder models_dir/name: ready, or not with the file and key at fault. */
static void folder_entry(const char *models_dir, const char *name, struct registry_entry *out) {
  struct dapo_err e = {0};
  int rc = 0;
  entry_init(out, name, REGISTRY_FOLDER);
  if ((size_t)snprintf(out->path, sizeof out->path, "%s/%s", models_dir, name) >= sizeof out->path)
    rc = dapo_errf(&e, DAPO_EINVAL, "path too long");
  if (!rc && preset_find(name))
    rc = dapo_errf(&e, DAPO_EINVAL, "the folder's name is taken by the preset '%s'", name);
  if (!rc) rc = read_config(out->path, &out->cfg, &out->created_at, &e);
  if (!rc) {
    if (is_file(out->path, "model.safetensors"))
      out->weights = "model.safetensors";
    else if (is_file(out->path, "model.safetensors.index.json"))
      out->weights = "model.safetensors.index.json";
    else
      rc = dapo_errf(&e, DAPO_EFORMAT,
                     "no weights: model.safetensors or model.safetensors.index.json is missing");
  }
  if (!rc && !is_file(out->path, "tokenizer.json"))
    rc = dapo_errf(&e, DAPO_EFORMAT, "tokenizer.json is missing");
  out->ready = rc == 0;
  if (rc) snprintf(out->error, sizeof out->error, "%s", e.msg);
}

/* The config of an adapter checkpoint's base (core/engine/lm.h LORA_BASE_FILE: a preset or a
 * folder), without opening it: the registry reads config files only. */
static int read_adapter_base(const char *dir, struct model_config *c, struct dapo_err *e) {
  char p[PATH_MAX + 64];
  if ((size_t)snprintf(p, sizeof p, "%s/" LORA_BASE_FILE, dir) >= sizeof p)
    return dapo_errf(e, DAPO_EINVAL, "path too long");
  json_error_t je;
  json_t *j = json_load_file(p, 0, &je);
  const char *base = json_string_value(json_object_get(j, "model"));
  int rc = 0;
  const struct preset *pr = base ? preset_find(base) : NULL;
  if (!base)
    rc = dapo_errf(e, DAPO_EFORMAT, LORA_BASE_FILE ": %s", j ? "no \"model\"" : je.text);
  else if (pr)
    *c = pr->cfg;
  else {
    int64_t mtime;
    rc = read_config(base, c, &mtime, e);
    if (rc) dapo_err_prefix(e, "the adapter's base %s: ", base);
  }
  json_decref(j);
  return rc;
}

/* The entry of checkpoint c of job_id. */
static void ckpt_entry(const char *job_id, const struct store_ckpt *c, struct registry_entry *out) {
  char id[REGISTRY_ID_MAX];
  struct dapo_err e = {0};
  int64_t mtime = 0;
  registry_ckpt_id(job_id, (long long)c->step, id, sizeof id);
  entry_init(out, id, REGISTRY_CHECKPOINT);
  snprintf(out->job_id, sizeof out->job_id, "%s", job_id);
  out->step = c->step;
  out->created_at = c->created_at;
  snprintf(out->path, sizeof out->path, "%s", c->path ? c->path : "");
  int adapter = is_file(out->path, "adapter_config.json");
  int rc = adapter ? read_adapter_base(out->path, &out->cfg, &e)
                   : read_config(out->path, &out->cfg, &mtime, &e);
  out->ready = rc == 0;
  if (rc)
    snprintf(out->error, sizeof out->error, "%s", e.msg);
  else
    out->weights = adapter ? "adapter_model.safetensors" : "model.safetensors";
}

/* A folder name offered as a model id: UTF-8 (ids are JSON strings), not hidden, not a
 * checkpoint being written. */
static int folder_name_ok(const char *name) {
  if (!name[0] || name[0] == '.' || strstr(name, ".tmp-")) return 0;
  json_t *probe = json_string(name);
  json_decref(probe);
  return probe != NULL;
}

void registry_ckpt_id(const char *job_id, long long step, char *buf, size_t cap) {
  snprintf(buf, cap, "%s:step-%lld", job_id, step);
}

/* Splits "{job_id}:step-{n}" into job (cap bytes) and *step. 0 when id has that shape. */
static int parse_ckpt_id(const char *id, char *job, size_t cap, int64_t *step) {
  const char *colon = strchr(id, ':');
  if (!colon || (size_t)(colon - id) >= cap || colon == id || strncmp(colon + 1, "step-", 5))
    return -1;
  const char *n = colon + 6;
  if (*n < '0' || *n > '9' || parse_i64(n, 0, INT64_MAX, step, "step", NULL)) return -1;
  memcpy(job, id, (size_t)(colon - id));
  job[colon - id] = '\0';
  return 0;
}

/* The checkpoint row of model id "{job_id}:step-{n}" visible to owner. 0, 1 (none), -1 (OOM). */
static int ckpt_lookup(const struct server *s, const char *id, const char *owner, char *job,
                       size_t cap, struct store_ckpt *out) {
  int64_t step;
  struct dapo_err e = {0};
  memset(out, 0, sizeof *out);
  if (!s->store || parse_ckpt_id(id, job, cap, &step)) return 1;
  struct store_job j;
  int rc = store_job_get(s->store, job, owner, &j, &e);
  store_job_deinit(&j);
  if (!rc) rc = store_ckpt_get(s->store, job, step, out, &e);
  if (rc == DAPO_ENOMEM) return -1;
  return rc ? 1 : 0;
}

int registry_find(const struct server *s, const char *id, const char *owner,
                  struct registry_entry *out) {
  const struct preset *p = preset_find(id);
  if (p) {
    preset_entry(p, out);
    return 0;
  }
  if (strchr(id, ':')) {
    char job[STORE_ID_MAX];
    struct store_ckpt c;
    int rc = ckpt_lookup(s, id, owner, job, sizeof job, &c);
    if (rc) return rc;
    ckpt_entry(job, &c, out);
    store_ckpt_deinit(&c);
    return 0;
  }
  if (!folder_name_ok(id) || strchr(id, '/')) return 1;
  char dir[PATH_MAX];
  struct stat st;
  if ((size_t)snprintf(dir, sizeof dir, "%s/%s", s->cfg.models_dir, id) >= sizeof dir ||
      stat(dir, &st) || !S_ISDIR(st.st_mode))
    return 1;
  folder_entry(s->cfg.models_dir, id, out);
  return 0;
}

struct chat_template *registry_chat_template(const struct server *s, const char *job_id,
                                             const char *spec, const char *owner, char *msg,
                                             size_t cap) {
  struct dapo_err e = {0};
  json_t *tpl = NULL, *tokcfg = NULL;
  if (job_id && s->store) {
    struct store_job job;
    if (!store_job_get(s->store, job_id, owner, &job, &e)) {
      tpl = json_incref(json_object_get(job.spec, "chat_template"));
      store_job_deinit(&job);
    }
  }
  if (!tpl && spec && strchr(spec, '/')) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", spec);
    tokcfg = json_load_file(path, 0, NULL);
    if (!json_is_string(json_object_get(tokcfg, "chat_template"))) {
      json_decref(tokcfg);
      tokcfg = NULL;
    }
  }
  if (!tpl && !tokcfg) tpl = json_loads(REGISTRY_DEFAULT_TEMPLATE, 0, NULL);
  struct chat_template *t = chat_from_spec(tpl, tokcfg, &e);
  if (!t) snprintf(msg, cap, "%s", e.msg);
  json_decref(tpl);
  json_decref(tokcfg);
  return t;
}

int registry_resolve(const struct server *s, const char *id, const char *owner, char **spec_out,
                     struct registry_entry *entry, char *msg, size_t cap) {
  struct registry_entry local;
  struct registry_entry *m = entry ? entry : &local;
  *spec_out = NULL;
  int rc = registry_find(s, id, owner, m);
  if (rc > 0) {
    if (strchr(id, ':'))
      snprintf(msg, cap, "no such model: '%.128s' is not a checkpoint of a job of yours", id);
    else
      snprintf(msg, cap,
               "no such model: '%.128s' is neither a preset, a folder in the models directory "
               "nor a checkpoint",
               id);
  }
  if (rc) return rc;
  if (!m->ready) {
    snprintf(msg, cap, "model '%.128s' is not usable: %.300s", id, m->error);
    return 1;
  }
  return (*spec_out = strdup(m->path)) ? 0 : -1;
}

/* ---- the listing ---- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the sub-folders of dir (owned, free each and the array); a missing folder
 * gives none. Returns 0 or -1 (out of memory). */
static int list_folders(const char *dir, char ***out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  char **v = NULL;
  int n = 0, cap = 0, rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) && n < MAX_FOLDERS) {
    if (!folder_name_ok(de->d_name)) {
      if (de->d_name[0] != '.') LOG(DEBUG, "models: folder name skipped: not UTF-8 or temporary");
      continue;
    }
    char p[PATH_MAX + 256];
    struct stat st;
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= sizeof p) continue;
    if (stat(p, &st) || !S_ISDIR(st.st_mode)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **nv = realloc(v, sizeof *v * (size_t)cap);
      if (!nv) {
        rc = -1;
        break;
      }
      v = nv;
    }
    if (!(v[n] = strdup(de->d_name))) {
      rc = -1;
      break;
    }
    n++;
  }
  closedir(d);
  if (rc) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
    return -1;
  }
  if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
  *out = v;
  *n_out = n;
  return 0;
}

/* Room for one more ref in l (cap slots); NULL out of memory. */
static struct registry_ref *list_push(struct registry_list *l, int *cap) {
  if (l->n == *cap) {
    int nc = *cap ? *cap * 2 : 64;
    struct registry_ref *nv = realloc(l->v, (size_t)nc * sizeof *nv);
    if (!nv) return NULL;
    l->v = nv;
    *cap = nc;
  }
  struct registry_ref *r = &l->v[l->n++];
  memset(r, 0, sizeof *r);
  return r;
}

/* Appends every checkpoint visible to owner, jobs oldest first, steps in order. */
static int list_ckpts(const struct server *s, const char *owner, struct registry_list *l,
                      int *cap) {
  struct store_job_list all = {0};
  struct dapo_err e = {0};
  char after[STORE_ID_MAX] = "";
  char(*ids)[STORE_ID_MAX] = NULL;
  size_t n_ids = 0, cap_ids = 0;
  int rc = 0, n = 0;
  for (;;) { /* job ids, newest first */
    rc = store_job_list(s->store, owner, NULL, STORE_PAGE_MAX, after[0] ? after : NULL, &all, &e);
    if (rc) break;
    for (size_t i = 0; i < all.n && !rc; i++) {
      if (n_ids == cap_ids) {
        cap_ids = cap_ids ? cap_ids * 2 : 64;
        void *nv = realloc(ids, cap_ids * sizeof *ids);
        if (!nv) {
          rc = -1;
          break;
        }
        ids = nv;
      }
      memcpy(ids[n_ids++], all.v[i].id, STORE_ID_MAX);
    }
    int more = !rc && all.has_more && all.n && n_ids < MAX_CKPT_MODELS;
    if (more) snprintf(after, sizeof after, "%s", all.v[all.n - 1].id);
    store_job_list_deinit(&all);
    if (!more) break;
  }
  for (size_t k = n_ids; !rc && k-- > 0 && n < MAX_CKPT_MODELS;) { /* oldest job first */
    struct store_ckpt_list cl = {0};
    if ((rc = store_ckpt_list(s->store, ids[k], &cl, &e))) break;
    for (size_t i = 0; i < cl.n && n < MAX_CKPT_MODELS; i++) {
      struct registry_ref *r = list_push(l, cap);
      if (!r) {
        rc = -1;
        break;
      }
      r->kind = REGISTRY_CHECKPOINT;
      memcpy(r->job_id, ids[k], STORE_ID_MAX);
      registry_ckpt_id(ids[k], (long long)cl.v[i].step, r->id, sizeof r->id);
      r->ckpt = cl.v[i]; /* moved */
      memset(&cl.v[i], 0, sizeof cl.v[i]);
      n++;
    }
    store_ckpt_list_deinit(&cl);
  }
  free(ids);
  if (rc && rc != -1) LOG(ERROR, "models: listing checkpoints: %s", e.msg);
  return rc ? -1 : 0;
}

int registry_list(const struct server *s, const char *owner, struct registry_list *out) {
  memset(out, 0, sizeof *out);
  int cap = 0, rc = 0;
  for (int i = 0; i < preset_count() && !rc; i++) {
    struct registry_ref *r = list_push(out, &cap);
    if (!r) {
      rc = -1;
      break;
    }
    r->kind = REGISTRY_PRESET;
    r->preset = preset_get(i);
    snprintf(r->id, sizeof r->id, "%s", r->preset->name);
  }
  char **names = NULL;
  int n_names = 0;
  if (!rc) rc = list_folders(s->cfg.models_dir, &names, &n_names);
  for (int i = 0; i < n_names; i++) {
    struct registry_ref *r = rc ? NULL : list_push(out, &cap);
    if (!rc && !r) rc = -1;
    if (r) {
      r->kind = REGISTRY_FOLDER;
      snprintf(r->id, sizeof r->id, "%s", names[i]);
    }
    free(names[i]);
  }
  free(names);
  if (!rc) rc = list_ckpts(s, owner, out, &cap);
  return rc;
}

void registry_list_deinit(struct registry_list *l) {
  for (int i = 0; l->v && i < l->n; i++) store_ckpt_deinit(&l->v[i].ckpt);
  free(l->v);
  memset(l, 0, sizeof *l);
}

int registry_list_entry(const struct server *s, const struct registry_ref *ref,
                        struct registry_entry *out) {
  switch (ref->kind) {
  case REGISTRY_PRESET: preset_entry(ref->preset, out); break;
  case REGISTRY_FOLDER: folder_entry(s->cfg.models_dir, ref->id, out); break;
  case REGISTRY_CHECKPOINT: ckpt_entry(ref->job_id, &ref->ckpt, out); break;
  }
  return 0;
}
