/* The model registry: what a model id names. An id is a preset (core/engine/preset.h), a sub-folder
 * of models_dir in the Hugging Face layout, or a fine-tuned checkpoint "{job_id}:step-{n}" (a
 * complete checkpoint in the store's index). Folders are inspected without loading weights:
 * config.json is parsed and validated, and the weight and tokenizer files must exist; the
 * weights themselves are checked when a job or a completion opens the model. Used by job
 * creation, the workers, completions and the /v1/models handlers (which render its entries).
 *
 * Thread-safety: every function may be called from any thread. */
#ifndef DAPOD_REGISTRY_H
#define DAPOD_REGISTRY_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "store.h"

struct server;
struct preset;

enum registry_kind { REGISTRY_PRESET, REGISTRY_FOLDER, REGISTRY_CHECKPOINT };

#define REGISTRY_ID_MAX (STORE_ID_MAX + 32) /* "{job_id}:step-{n}" */

/* What an id names, as far as the registry can tell without loading weights. */
struct registry_entry {
  char id[REGISTRY_ID_MAX];
  enum registry_kind kind;
  int ready;                   /* 1: usable; 0: error says why (a folder or checkpoint only) */
  char error[512];             /* when !ready: the file and key at fault */
  char path[PATH_MAX];         /* what lm_open takes: the preset's name or the folder's path */
  int64_t created_at;          /* Unix seconds (folder: config.json's mtime); 0 for a preset */
  const char *weights;         /* "model.safetensors" or its index, "adapter_model.safetensors"
                                  for an adapter checkpoint (borrowed static); NULL */
  struct model_config cfg;     /* when ready */
  const struct preset *preset; /* REGISTRY_PRESET: the table row (borrowed static) */
  char job_id[STORE_ID_MAX];   /* REGISTRY_CHECKPOINT: its job and step */
  int64_t step;
};

/* Looks id up among what owner may see (checkpoints of other owners are invisible; NULL: any
 * owner). Returns 0 with *out filled (ready or not); 1 when no model has that id; -1 out of
 * memory. */
int registry_find(const struct server *s, const char *id, const char *owner,
                  struct registry_entry *out);

/* What lm_open takes for model id (a preset name, the folder's or the checkpoint's path) into
 * *spec_out (owned, free()), with its entry in *entry (may be NULL). Returns 0; 1 when id names
 * no usable model (unknown, an invalid folder, a checkpoint not visible to owner), with msg (cap
 * bytes) saying why; -1 when out of memory. */
int registry_resolve(const struct server *s, const char *id, const char *owner, char **spec_out,
                     struct registry_entry *entry, char *msg, size_t cap);

/* The chat template of models without one (the presets): the message texts one after another,
 * a system message and an assistant's turn each ending with a newline. */
#define REGISTRY_DEFAULT_TEMPLATE                                                                  \
  "{\"system\": \"{content}\\n\", \"user\": \"{content}\", \"assistant\": \"{content}\\n\"}"

struct chat_template;
/* The chat template messages to a model are rendered with: job_id's (a checkpoint's job, may be
 * NULL) chat_template when it has one, else the folder spec's tokenizer_config.json template (a
 * path: registry_resolve's spec), else REGISTRY_DEFAULT_TEMPLATE. NULL with msg (cap bytes) when
 * it does not build. Owned: chat_free. */
struct chat_template *registry_chat_template(const struct server *s, const char *job_id,
                                             const char *spec, const char *owner, char *msg,
                                             size_t cap);

/* Writes the checkpoint model id "{job_id}:step-{n}" into buf (cap bytes). */
void registry_ckpt_id(const char *job_id, long long step, char *buf, size_t cap);

/* The listing order of GET /v1/models: presets in table order, folders by name, then
 * checkpoints (jobs oldest first, steps in order). Ids only; registry_list_entry fills one. */
struct registry_ref {
  char id[REGISTRY_ID_MAX];
  enum registry_kind kind;
  const struct preset *preset; /* REGISTRY_PRESET */
  char job_id[STORE_ID_MAX];   /* REGISTRY_CHECKPOINT */
  struct store_ckpt ckpt;      /* REGISTRY_CHECKPOINT: its index row (owned) */
};
struct registry_list {
  struct registry_ref *v;
  int n;
};

/* Every model visible to owner, in listing order (at most 1,000 folders and 10,000
 * checkpoints). Returns 0, -1 out of memory or on a store error (logged). Release with
 * registry_list_deinit in any case. */
int registry_list(const struct server *s, const char *owner, struct registry_list *out);
void registry_list_deinit(struct registry_list *l);

/* The entry of one listed model (as registry_find would give it). 0, or -1 out of memory. */
int registry_list_entry(const struct server *s, const struct registry_ref *ref,
                        struct registry_entry *out);

#endif
