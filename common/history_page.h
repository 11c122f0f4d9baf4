// The config history's page bounds, one rule for the daemon's ListConfigHistory and for
// spgatectl's `gates history --limit` (docs/api.md): a client refuses what the daemon would,
// in its own flag's words.
#ifndef SPGATE_COMMON_HISTORY_PAGE_H_
#define SPGATE_COMMON_HISTORY_PAGE_H_

namespace spgate {

// Most entries one ListConfigHistory page returns, and the page size when none is asked.
inline constexpr int kMaxHistoryPageSize = 500;
inline constexpr int kDefaultHistoryPageSize = 50;

}  // namespace spgate

#endif  // SPGATE_COMMON_HISTORY_PAGE_H_
