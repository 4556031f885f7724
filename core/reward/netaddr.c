/* IP address classes for the judge's connect-time check (netaddr.h): a table of IPv4 ranges,
 * IPv6 ranges by prefix, and the IPv6 forms that carry an IPv4 address unwrapped first. */
#include "netaddr.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct v4_range {
  uint32_t net;
  int bits;
  enum netaddr_class cls;
};

/* First match wins: 255.255.255.255 before 240/4, both reserved anyway. */
static const struct v4_range V4[] = {
    {0x00000000u, 8, NETADDR_UNSPECIFIED}, /* 0.0.0.0/8 */
    {0x7f000000u, 8, NETADDR_LOOPBACK},    /* 127.0.0.0/8 */
    {0xa9fe0000u, 16, NETADDR_LINK_LOCAL}, /* 169.254.0.0/16 */
    {0x0a000000u, 8, NETADDR_PRIVATE},     /* 10.0.0.0/8 */
    {0xac100000u, 12, NETADDR_PRIVATE},    /* 172.16.0.0/12 */
    {0xc0a80000u, 16, NETADDR_PRIVATE},    /* 192.168.0.0/16 */
    {0x64400000u, 10, NETADDR_PRIVATE},    /* 100.64.0.0/10 */
    {0xe0000000u, 4, NETADDR_MULTICAST},   /* 224.0.0.0/4 */
    {0xf0000000u, 4, NETADDR_RESERVED},    /* 240.0.0.0/4, 255.255.255.255 included */
};

enum netaddr_class netaddr_class_v4(uint32_t a) {
  for (size_t i = 0; i < sizeof V4 / sizeof V4[0]; i++) {
    uint32_t mask = 0xffffffffu << (32 - V4[i].bits);
    if ((a & mask) == V4[i].net) return V4[i].cls;
  }
  return NETADDR_PUBLIC;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static int all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* The IPv4 address an IPv6 form carries; 0 when it carries none. */
static int embedded_v4(const uint8_t *b, uint32_t *v4) {
  static const uint8_t NAT64[12] = {0x00, 0x64, 0xff, 0x9b}; /* 64:ff9b::/96 */
  if (all_zero(b, 10) && b[10] == 0xff && b[11] == 0xff) {   /* ::ffff:a.b.c.d, mapped */
    *v4 = be32(b + 12);
    return 1;
  }
  if (all_zero(b, 8) && b[8] == 0xff && b[9] == 0xff && !b[10] && !b[11]) { /* ::ffff:0:a.b.c.d */
    *v4 = be32(b + 12);
    return 1;
  }
  if (!memcmp(b, NAT64, 12)) {
    *v4 = be32(b + 12);
    return 1;
  }
  if (b[0] == 0x20 && b[1] == 0x02) { /* 2002:AABB:CCDD::/48, 6to4 */
    *v4 = be32(b + 2);
    return 1;
  }
  /* ::a.b.c.d, compatible (deprecated); :: and ::1 are not IPv4 */
  if (all_zero(b, 12) && be32(b + 12) > 1) {
    *v4 = be32(b + 12);
    return 1;
  }
  return 0;
}

enum netaddr_class netaddr_class_v6(const struct in6_addr *a) {
  const uint8_t *b = a->s6_addr;
  uint32_t v4;
  if (all_zero(b, 16)) return NETADDR_UNSPECIFIED;
  if (all_zero(b, 15) && b[15] == 1) return NETADDR_LOOPBACK;
  if (embedded_v4(b, &v4)) return netaddr_class_v4(v4);
  if (b[0] == 0xff) return NETADDR_MULTICAST;                           /* ff00::/8 */
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return NETADDR_LINK_LOCAL; /* fe80::/10 */
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return NETADDR_PRIVATE;    /* fec0::/10 */
  if ((b[0] & 0xfe) == 0xfc) return NETADDR_PRIVATE;                    /* fc00::/7 */
  return NETADDR_PUBLIC;
}

enum netaddr_class netaddr_classify(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return netaddr_class_v4(ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr));
  if (sa->sa_family == AF_INET6)
    return netaddr_class_v6(&((const struct sockaddr_in6 *)sa)->sin6_addr);
  return NETADDR_RESERVED;
}

const char *netaddr_class_name(enum netaddr_class c) {
  static const char *const NAMES[] = {"public",      "loopback",  "link-local", "private",
                                      "unspecified", "multicast", "reserved"};
  return (int)c >= 0 && (size_t)c < sizeof NAMES / sizeof NAMES[0] ? NAMES[c] : "reserved";
}

const char *netaddr_format(const struct sockaddr *sa, char *buf, size_t cap) {
  const void *src = NULL;
  if (sa->sa_family == AF_INET) src = &((const struct sockaddr_in *)sa)->sin_addr;
  if (sa->sa_family == AF_INET6) src = &((const struct sockaddr_in6 *)sa)->sin6_addr;
  if (!src || !inet_ntop(sa->sa_family, src, buf, (socklen_t)cap))
    snprintf(buf, cap, "(family %d)", (int)sa->sa_family);
  return buf;
}

/* The address as 16 bytes, IPv4 in its mapped form. */
static void as_v6(const struct sockaddr *sa, uint8_t out[16]) {
  memset(out, 0, 16);
  if (sa->sa_family == AF_INET6) {
    memcpy(out, ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr, 16);
  } else {
    out[10] = out[11] = 0xff;
    memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
  }
}

int netaddr_equals_literal(const struct sockaddr *sa, const char *text) {
  if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) return 0;
  char t[INET6_ADDRSTRLEN + 2];
  size_t n = strlen(text);
  if (n >= 2 && text[0] == '[' && text[n - 1] == ']') text++, n -= 2;
  if (n >= sizeof t) return 0;
  memcpy(t, text, n);
  t[n] = '\0';
  struct sockaddr_in6 lit6 = {.sin6_family = AF_INET6};
  struct sockaddr_in lit4 = {.sin_family = AF_INET};
  const struct sockaddr *lit;
  if (inet_pton(AF_INET, t, &lit4.sin_addr) == 1)
    lit = (const struct sockaddr *)&lit4;
  else if (inet_pton(AF_INET6, t, &lit6.sin6_addr) == 1)
    lit = (const struct sockaddr *)&lit6;
  else
    return 0;
  uint8_t a[16], b[16];
  as_v6(sa, a);
  as_v6(lit, b);
  return !memcmp(a, b, 16);
}
