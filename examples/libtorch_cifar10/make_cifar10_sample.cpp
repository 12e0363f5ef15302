// make_cifar10_sample: writes a small data set in the CIFAR-10 binary format (cifar10_binary.hpp) that a classifier
// can learn, for trying the example without the download and for its test:
//
//   make_cifar10_sample DIR [TRAIN_RECORDS [TEST_RECORDS [SEED]]]    (defaults 600, 200, 1)
//
// writes DIR/data_batch_1.bin and DIR/test_batch.bin. Each record's label is drawn uniformly from 0-9; its image
// is noise on a colour that differs by plane (red about 0.75, green 0.5, blue 0.25 of full scale, so a reader that
// mixes up the planes sees other channel means), with an 8x8 bright square in the cell of a 4x4 grid that its
// label selects. No libtorch: it shares nothing with the reader it tests.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int kSide = 32;
constexpr int kCell = 8;
constexpr int kBase[3] = {160, 96, 32};  // each plane's background; noise adds 0-63

void write_records(const std::filesystem::path& file, int64_t records, std::mt19937_64& rng) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + file.string());
  std::uniform_int_distribution<int> label_of(0, 9);
  std::uniform_int_distribution<int> noise(0, 63);
  std::vector<unsigned char> record(1 + 3 * kSide * kSide);
  for (int64_t r = 0; r < records; ++r) {
    const int label = label_of(rng);
    record[0] = static_cast<unsigned char>(label);
    const int cell_y = (label / 4) * kCell, cell_x = (label % 4) * kCell;
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < kSide; ++y) {
        for (int x = 0; x < kSide; ++x) {
          const bool square = y >= cell_y && y < cell_y + kCell && x >= cell_x && x < cell_x + kCell;
          const int value = square ? 255 - noise(rng) / 4 : kBase[c] + noise(rng);
          record[1 + static_cast<size_t>((c * kSide + y) * kSide + x)] = static_cast<unsigned char>(value);
        }
      }
    }
    out.write(reinterpret_cast<const char*>(record.data()), static_cast<std::streamsize>(record.size()));
  }
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2 || argc > 5) {
      std::fputs("usage: make_cifar10_sample DIR [TRAIN_RECORDS [TEST_RECORDS [SEED]]]\n", stderr);
      return 2;
    }
    const std::filesystem::path dir = argv[1];
    const int64_t train = argc > 2 ? std::stoll(argv[2]) : 600;
    const int64_t test = argc > 3 ? std::stoll(argv[3]) : 200;
    const uint64_t seed = argc > 4 ? std::stoull(argv[4]) : 1;
    if (train < 1 || test < 1) throw std::invalid_argument("TRAIN_RECORDS and TEST_RECORDS must be at least 1");
    std::filesystem::create_directories(dir);
    std::mt19937_64 rng(seed);
    write_records(dir / "data_batch_1.bin", train, rng);
    write_records(dir / "test_batch.bin", test, rng);
    std::printf("wrote %lld training and %lld test records to %s\n", static_cast<long long>(train),
                static_cast<long long>(test), dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_cifar10_sample: %s\n", e.what());
    return 1;
  }
}
