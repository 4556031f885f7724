/* SSRF defences of the http judge (label security): the address classifier (core/reward/netaddr.h)
 * on both sides of every special range and on the IPv6 forms that embed IPv4, and end-to-end judges
 * whose host name resolves (CURLOPT_RESOLVE: no DNS, no /etc/hosts) to loopback, link-local,
 * private and IPv4-mapped addresses, checked at connect time; a judge answering 302 is not
 * followed. The judge server is a small responder thread on 127.0.0.1 that counts requests. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "judge.h"
#include "netaddr.h"

/* ---- the classifier ---- */

static enum netaddr_class class_of(const char *text) {
  struct sockaddr_storage ss = {0};
  struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
  if (inet_pton(AF_INET, text, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
  } else if (inet_pton(AF_INET6, text, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
  } else {
    CHECK_MSG(0, "'%s' is not an address", text);
    return NETADDR_RESERVED;
  }
  return netaddr_classify((struct sockaddr *)&ss);
}

static void test_classifier(void) {
  static const struct {
    const char *addr;
    enum netaddr_class want;
  } T[] = {
      /* IPv4: the first and last address of each range, and the neighbours outside it */
      {"0.0.0.0", NETADDR_UNSPECIFIED},
      {"0.255.255.255", NETADDR_UNSPECIFIED},
      {"1.0.0.0", NETADDR_PUBLIC},
      {"9.255.255.255", NETADDR_PUBLIC},
      {"10.0.0.0", NETADDR_PRIVATE},
      {"10.255.255.255", NETADDR_PRIVATE},
      {"11.0.0.0", NETADDR_PUBLIC},
      {"100.63.255.255", NETADDR_PUBLIC},
      {"100.64.0.0", NETADDR_PRIVATE},
      {"100.127.255.255", NETADDR_PRIVATE},
      {"100.128.0.0", NETADDR_PUBLIC},
      {"126.255.255.255", NETADDR_PUBLIC},
      {"127.0.0.0", NETADDR_LOOPBACK},
      {"127.0.0.1", NETADDR_LOOPBACK},
      {"127.255.255.255", NETADDR_LOOPBACK},
      {"128.0.0.0", NETADDR_PUBLIC},
      {"169.253.255.255", NETADDR_PUBLIC},
      {"169.254.0.0", NETADDR_LINK_LOCAL},
      {"169.254.169.254", NETADDR_LINK_LOCAL},
      {"169.254.255.255", NETADDR_LINK_LOCAL},
      {"169.255.0.0", NETADDR_PUBLIC},
      {"172.15.255.255", NETADDR_PUBLIC},
      {"172.16.0.0", NETADDR_PRIVATE},
      {"172.31.255.255", NETADDR_PRIVATE},
      {"172.32.0.0", NETADDR_PUBLIC},
      {"192.167.255.255", NETADDR_PUBLIC},
      {"192.168.0.0", NETADDR_PRIVATE},
      {"192.168.255.255", NETADDR_PRIVATE},
      {"192.169.0.0", NETADDR_PUBLIC},
      {"8.8.8.8", NETADDR_PUBLIC},
      {"223.255.255.255", NETADDR_PUBLIC},
      {"224.0.0.0", NETADDR_MULTICAST},
      {"239.255.255.255", NETADDR_MULTICAST},
      {"240.0.0.0", NETADDR_RESERVED},
      {"255.255.255.255", NETADDR_RESERVED},
      /* IPv6 */
      {"::", NETADDR_UNSPECIFIED},
      {"::1", NETADDR_LOOPBACK},
      {"2001:db8::1", NETADDR_PUBLIC},
      {"2606:4700::1111", NETADDR_PUBLIC},
      {"fe7f:ffff::1", NETADDR_PUBLIC},
      {"fe80::", NETADDR_LINK_LOCAL},
      {"fe80::1", NETADDR_LINK_LOCAL},
      {"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", NETADDR_LINK_LOCAL},
      {"fec0::1", NETADDR_PRIVATE},
      {"fbff:ffff::1", NETADDR_PUBLIC},
      {"fc00::", NETADDR_PRIVATE},
      {"fd12:3456::1", NETADDR_PRIVATE},
      {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", NETADDR_PRIVATE},
      {"fe00::1", NETADDR_PUBLIC},
      {"ff00::", NETADDR_MULTICAST},
      {"ff02::1", NETADDR_MULTICAST},
      /* IPv6 forms that carry an IPv4 address are judged by it */
      {"::ffff:127.0.0.1", NETADDR_LOOPBACK},
      {"::ffff:7f00:1", NETADDR_LOOPBACK},
      {"::ffff:169.254.169.254", NETADDR_LINK_LOCAL},
      {"::ffff:10.1.2.3", NETADDR_PRIVATE},
      {"::ffff:192.168.1.1", NETADDR_PRIVATE},
      {"::ffff:0.0.0.0", NETADDR_UNSPECIFIED},
      {"::ffff:224.0.0.1", NETADDR_MULTICAST},
      {"::ffff:8.8.8.8", NETADDR_PUBLIC},
      {"::ffff:0:127.0.0.1", NETADDR_LOOPBACK}, /* SIIT, IPv4-translated */
      {"::ffff:0:8.8.8.8", NETADDR_PUBLIC},
      {"::127.0.0.1", NETADDR_LOOPBACK}, /* IPv4-compatible (deprecated) */
      {"::10.0.0.1", NETADDR_PRIVATE},
      {"64:ff9b::127.0.0.1", NETADDR_LOOPBACK}, /* NAT64 */
      {"64:ff9b::169.254.169.254", NETADDR_LINK_LOCAL},
      {"64:ff9b::8.8.8.8", NETADDR_PUBLIC},
      {"2002:7f00:1::", NETADDR_LOOPBACK}, /* 6to4 of 127.0.0.1 */
      {"2002:a9fe:a9fe::1", NETADDR_LINK_LOCAL},
      {"2002:0808:0808::1", NETADDR_PUBLIC},
  };
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
    enum netaddr_class got = class_of(T[i].addr);
    CHECK_MSG(got == T[i].want, "%s: %s, want %s", T[i].addr, netaddr_class_name(got),
              netaddr_class_name(T[i].want));
  }
  struct sockaddr un = {.sa_family = AF_UNIX};
  CHECK(netaddr_classify(&un) == NETADDR_RESERVED);

  struct sockaddr_in6 m = {.sin6_family = AF_INET6};
  inet_pton(AF_INET6, "::ffff:10.0.0.5", &m.sin6_addr);
  CHECK(netaddr_equals_literal((struct sockaddr *)&m, "10.0.0.5"));
  CHECK(netaddr_equals_literal((struct sockaddr *)&m, "[::ffff:10.0.0.5]"));
  CHECK(!netaddr_equals_literal((struct sockaddr *)&m, "10.0.0.6"));
  CHECK(!netaddr_equals_literal((struct sockaddr *)&m, "judge.example"));
  struct sockaddr_in v4 = {.sin_family = AF_INET};
  inet_pton(AF_INET, "10.0.0.5", &v4.sin_addr);
  CHECK(netaddr_equals_literal((struct sockaddr *)&v4, "::ffff:10.0.0.5"));
  CHECK(netaddr_equals_literal((struct sockaddr *)&v4, "10.0.0.5"));
  char buf[INET6_ADDRSTRLEN];
  CHECK(!strcmp(netaddr_format((struct sockaddr *)&m, buf, sizeof buf), "::ffff:10.0.0.5"));
}

/* ---- a judge server: answers every request with one canned reply, counts them ---- */

struct responder {
  int fd, port;
  const char *reply; /* the whole HTTP response */
  atomic_int requests;
  pthread_t th;
};

static void *responder_main(void *arg) {
  struct responder *r = arg;
  for (;;) {
    int c = accept(r->fd, NULL, NULL);
    if (c < 0) {
      if (errno == EINTR) continue;
      return NULL; /* the listener was shut down */
    }
    char buf[65536];
    size_t n = 0;
    long want = -1;
    while (n < sizeof buf - 1) { /* headers, then Content-Length bytes of body */
      ssize_t k = read(c, buf + n, sizeof buf - 1 - n);
      if (k <= 0) break;
      n += (size_t)k;
      buf[n] = '\0';
      char *end = strstr(buf, "\r\n\r\n");
      if (!end) continue;
      if (want < 0) {
        char *cl = strcasestr(buf, "Content-Length:");
        want = (long)(end + 4 - buf) + (cl ? strtol(cl + 15, NULL, 10) : 0);
      }
      if ((long)n >= want) break;
    }
    atomic_fetch_add(&r->requests, 1);
    ssize_t w = write(c, r->reply, strlen(r->reply));
    (void)w;
    close(c);
  }
}

static int responder_start(struct responder *r, const char *reply) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  r->reply = reply;
  atomic_init(&r->requests, 0);
  r->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (r->fd < 0 || bind(r->fd, (struct sockaddr *)&a, sizeof a) ||
      getsockname(r->fd, (struct sockaddr *)&a, &al) || listen(r->fd, 16))
    return -1;
  r->port = ntohs(a.sin_port);
  return pthread_create(&r->th, NULL, responder_main, r) ? -1 : 0;
}

static void responder_stop(struct responder *r) {
  shutdown(r->fd, SHUT_RDWR); /* wakes accept() */
  pthread_join(r->th, NULL);
  close(r->fd);
}

/* Runs a one-item openrlhf judge on url under pol; returns judge_run's code, e->msg set. */
static int run_judge(const char *url, const struct judge_policy *pol, double *reward,
                     struct dapo_err *e) {
  char spec[512];
  snprintf(spec, sizeof spec,
           "{\"type\": \"http\", \"url\": \"%s\", \"format\": \"openrlhf\", \"max_retries\": 0, "
           "\"timeout_ms\": 5000}",
           url);
  json_t *js = json_loads(spec, 0, NULL);
  struct judge *j = judge_new(js, pol, e);
  json_decref(js);
  if (!j) return -1000;
  struct judge_item it = {.id = "a", .response = "1"};
  struct judge_result res;
  int rc = judge_run(j, NULL, 1, &it, 1, &res, NULL, NULL, e);
  if (!rc) *reward = res.reward;
  judge_results_release(&res, 1);
  judge_free(j);
  return rc;
}

static void test_judges(void) {
  static const char OK[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           "Content-Length: 16\r\nConnection: close\r\n\r\n{\"rewards\": [1]}";
  struct responder ok, other, redir;
  CHECK(responder_start(&ok, OK) == 0);
  CHECK(responder_start(&other, OK) == 0);
  char redirect[256];
  snprintf(redirect, sizeof redirect,
           "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/score\r\nContent-Length: 0\r\n"
           "Connection: close\r\n\r\n",
           other.port);
  CHECK(responder_start(&redir, redirect) == 0);

  char url[128], res_lo[96], res_ll[96], res_pv[96], res_mp[96], res_lh[96];
  snprintf(url, sizeof url, "http://judge.test:%d/score", ok.port);
  snprintf(res_lo, sizeof res_lo, "judge.test:%d:127.0.0.1", ok.port);
  snprintf(res_ll, sizeof res_ll, "judge.test:%d:169.254.169.254", ok.port);
  snprintf(res_pv, sizeof res_pv, "judge.test:%d:10.1.2.3", ok.port);
  snprintf(res_mp, sizeof res_mp, "judge.test:%d:[::ffff:127.0.0.1]", ok.port);
  snprintf(res_lh, sizeof res_lh, "localhost:%d:127.0.0.1", ok.port);
  const char *name_only[] = {"judge.test"};
  const char *name_and_addr[] = {"judge.test", "127.0.0.1"};
  struct dapo_err e = {0};
  double reward = 0;

  /* an allowed name that resolves to loopback: refused at connect time, nothing sent */
  const char *r1[] = {res_lo};
  struct judge_policy pol = {name_only, 1, 0, r1, 1, NULL, NULL};
  int rc = run_judge(url, &pol, &reward, &e);
  CHECK_MSG(rc == DAPO_EIO && strstr(e.msg, "refused to connect to 127.0.0.1: 'judge.test' "
                                            "resolved to a loopback address"),
            "rc %d: %s", rc, e.msg);
  fprintf(stderr, "name -> loopback: %s\n", e.msg);
  /* judge_allow_private does not cover loopback */
  pol.allow_private = 1;
  rc = run_judge(url, &pol, &reward, &e);
  CHECK_MSG(rc == DAPO_EIO && strstr(e.msg, "loopback address"), "rc %d: %s", rc, e.msg);
  /* the IPv4-mapped form of loopback is loopback too */
  const char *r2[] = {res_mp};
  pol = (struct judge_policy){name_only, 1, 1, r2, 1, NULL, NULL};
  rc = run_judge(url, &pol, &reward, &e);
  CHECK_MSG(rc == DAPO_EIO && strstr(e.msg, "refused to connect to ::ffff:127.0.0.1: "
                                            "'judge.test' resolved to a loopback address"),
            "rc %d: %s", rc, e.msg);
  fprintf(stderr, "name -> mapped loopback: %s\n", e.msg);
  /* link-local (cloud metadata): refused, even with judge_allow_private */
  const char *r3[] = {res_ll};
  pol = (struct judge_policy){name_only, 1, 1, r3, 1, NULL, NULL};
  rc = run_judge(url, &pol, &reward, &e);
  CHECK_MSG(rc == DAPO_EIO && strstr(e.msg, "refused to connect to 169.254.169.254: "
                                            "'judge.test' resolved to a link-local address"),
            "rc %d: %s", rc, e.msg);
  /* private: refused without judge_allow_private, and the message says how to allow it */
  const char *r4[] = {res_pv};
  pol = (struct judge_policy){name_only, 1, 0, r4, 1, NULL, NULL};
  rc = run_judge(url, &pol, &reward, &e);
  CHECK_MSG(rc == DAPO_EIO && strstr(e.msg, "refused to connect to 10.1.2.3: 'judge.test' "
                                            "resolved to a private address, which needs the "
                                            "address itself in judge_allowed_hosts (or "
                                            "judge_allow_private)"),
            "rc %d: %s", rc, e.msg);
  CHECK_MSG(atomic_load(&ok.requests) == 0, "%d requests reached the judge",
            atomic_load(&ok.requests));

  /* the address written in the allowlist allows the name to reach it */
  pol = (struct judge_policy){name_and_addr, 2, 0, r1, 1, NULL, NULL};
  reward = 0;
  rc = run_judge(url, &pol, &reward, &e);
  CHECK_MSG(rc == 0 && reward == 1.0, "rc %d: %s", rc, e.msg);
  CHECK(atomic_load(&ok.requests) == 1);
  /* "localhost" reaches loopback; a literal URL host reaches itself */
  const char *lh[] = {"localhost"};
  const char *r5[] = {res_lh};
  pol = (struct judge_policy){lh, 1, 0, r5, 1, NULL, NULL};
  snprintf(url, sizeof url, "http://localhost:%d/score", ok.port);
  rc = run_judge(url, &pol, &reward, &e);
  CHECK_MSG(rc == 0, "localhost: rc %d: %s", rc, e.msg);
  rc = run_judge(url, NULL, &reward, &e); /* the default policy, with real resolution */
  CHECK_MSG(rc == 0, "localhost, default policy: rc %d: %s", rc, e.msg);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/score", ok.port);
  rc = run_judge(url, NULL, &reward, &e);
  CHECK_MSG(rc == 0, "127.0.0.1, default policy: rc %d: %s", rc, e.msg);

  /* a redirect is not followed: the judge fails with HTTP 302 and the target sees nothing */
  snprintf(url, sizeof url, "http://127.0.0.1:%d/score", redir.port);
  rc = run_judge(url, NULL, &reward, &e);
  CHECK_MSG(rc == DAPO_EIO && strstr(e.msg, "HTTP 302"), "rc %d: %s", rc, e.msg);
  CHECK(atomic_load(&redir.requests) == 1);
  CHECK_MSG(atomic_load(&other.requests) == 0, "the redirect was followed");
  fprintf(stderr, "redirect: %s\n", e.msg);

  responder_stop(&ok);
  responder_stop(&other);
  responder_stop(&redir);
}

int main(void) {
  test_classifier();
  test_judges();
  judge_global_cleanup();
  return check_done("test_judge_ssrf");
}
