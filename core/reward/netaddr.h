/* Classifying IP addresses for the judge's connect-time check (SSRF defence): which special
 * ranges an address falls in, with the IPv6 forms that embed an IPv4 address (mapped
 * ::ffff:a.b.c.d, compatible ::a.b.c.d, SIIT ::ffff:0:a.b.c.d, NAT64 64:ff9b::/96, 6to4
 * 2002::/16) judged by the IPv4 address inside. */
#ifndef DAPO_NETADDR_H
#define DAPO_NETADDR_H

#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>

enum netaddr_class {
  NETADDR_PUBLIC = 0,  /* none of the below: a global unicast address */
  NETADDR_LOOPBACK,    /* 127.0.0.0/8, ::1 */
  NETADDR_LINK_LOCAL,  /* 169.254.0.0/16 (cloud metadata lives here), fe80::/10 */
  NETADDR_PRIVATE,     /* 10/8, 172.16/12, 192.168/16, 100.64/10 (shared/CGNAT), fc00::/7,
                          fec0::/10 (site-local, deprecated) */
  NETADDR_UNSPECIFIED, /* 0.0.0.0/8 ("this network": Linux connects 0.0.0.0 to this host), :: */
  NETADDR_MULTICAST,   /* 224.0.0.0/4, ff00::/8 */
  NETADDR_RESERVED,    /* 240.0.0.0/4 and the broadcast 255.255.255.255; an address family
                          other than IPv4/IPv6 */
};

/* The class of an IPv4 address given in host byte order. */
enum netaddr_class netaddr_class_v4(uint32_t host_order);

/* The class of an IPv6 address; forms embedding IPv4 take the embedded address's class. */
enum netaddr_class netaddr_class_v6(const struct in6_addr *a);

/* The class of a socket address (AF_INET, AF_INET6; anything else is NETADDR_RESERVED). */
enum netaddr_class netaddr_classify(const struct sockaddr *sa);

/* "public", "loopback", "link-local", "private", "unspecified", "multicast", "reserved".
 * Static string. */
const char *netaddr_class_name(enum netaddr_class c);

/* The address in sa as text ("10.0.0.1", "fe80::1"; IPv6 forms embedding IPv4 as written by
 * inet_ntop) into buf (cap >= INET6_ADDRSTRLEN). Returns buf; "(family N)" for other families. */
const char *netaddr_format(const struct sockaddr *sa, char *buf, size_t cap);

/* 1 when sa is the same address as the literal text (IPv4 or IPv6, brackets allowed); an IPv4
 * literal also matches its IPv4-mapped IPv6 form and the other way round. 0 otherwise, also when
 * text is not an address. */
int netaddr_equals_literal(const struct sockaddr *sa, const char *text);

#endif
